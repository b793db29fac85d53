package e2e

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// desktopToolkit is the desktop toolkit layer of the test: Xvfb and
// xterm copied from this host's packages by
// examples/build_desktop_toolkit.sh (no network, seconds).
const desktopToolkit = "desktop:test"

// pngColours counts the distinct colours of a PNG, up to 3 (a blank
// screen has one).
func pngColours(t *testing.T, b []byte) int {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screen is not a PNG: %v", err)
	}
	seen := map[[3]uint32]bool{}
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y += 3 {
		for x := r.Min.X; x < r.Max.X; x += 3 {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			if seen[[3]uint32{cr, cg, cb}] = true; len(seen) >= 3 {
				return 3
			}
		}
	}
	return len(seen)
}

// buildDesktopToolkit builds desktopToolkit on s from this host's
// packages (the caller requires Xvfb, xterm, python3 and dpkg-query).
func buildDesktopToolkit(ctx context.Context, t *testing.T, s *testutil.Server) {
	t.Helper()
	build := exec.CommandContext(ctx, "bash", filepath.Join(testutil.RepoRoot(), "examples", "build_desktop_toolkit.sh"))
	build.Env = append(os.Environ(), "DSEC_URL="+s.URL, "DSEC_API_KEY="+s.Key, "NAME="+desktopToolkit,
		"DSEC="+filepath.Join(testutil.Binaries(t), "dsec"))
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the desktop toolkit: %v\n%s", err, out)
	}
	t.Logf("desktop toolkit built in %s", time.Since(start).Round(time.Millisecond))
}

// poll calls ok until it is true or d passes.
func poll(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	testutil.EventuallyTrue(t, d, what, ok)
}

func isInvalid(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae) && ae.Code == api.CodeInvalid
}

// A container with the desktop toolkit has a screen: the agent (its
// init) starts the toolkit's X server and terminal, the screen shows the
// terminal, text typed into it runs in the sandbox's shell, and the
// screen changes; bad input is 400; a reset brings the desktop back; a
// container without an X server has no screen; nothing is left behind.
func TestDesktopContainer(t *testing.T) {
	testutil.Require(t, testutil.Tool("Xvfb"), testutil.Tool("xterm"), testutil.Tool("python3"), testutil.Tool("dpkg-query"))
	s := startServer(t)
	c := s.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	buildDesktopToolkit(ctx, t, s)
	sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{
		Layers:    &api.LayerRefs{Base: "base:minimal", Toolkit: desktopToolkit},
		Resources: api.Resources{MemoryMB: 256},
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer c.DeleteSandbox(context.Background(), sb.ID)

	var before []byte
	waitTerminal := func() {
		t.Cleanup(func() {
			if t.Failed() {
				dumpProcesses(t, c, sb.ID)
			}
		})
		poll(t, 30*time.Second, "the terminal on the screen", func() bool {
			b, err := c.Screenshot(ctx, sb.ID)
			if err != nil && !isInvalid(err) { // before the X server is up: no screen yet
				t.Fatalf("screenshot: %v", err)
			}
			before = b
			return err == nil && pngColours(t, b) >= 2
		})
	}
	waitTerminal()
	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || got.Display == nil || *got.Display != (api.Display{Width: 1024, Height: 768}) {
		t.Fatalf("sandbox display: %+v, %v", got.Display, err)
	}

	res, err := c.Input(ctx, sb.ID, client.Click(200, 200, "left", 1), client.Type("echo typed > /tmp/t\n"))
	if err != nil || res.Done != 2 || res.Display.Width != 1024 {
		t.Fatalf("input: %+v, %v", res, err)
	}
	poll(t, 15*time.Second, "the typed command's file", func() bool {
		r, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"cat", "/tmp/t"}})
		return err == nil && r.ExitCode == 0 && r.Stdout == "typed\n"
	})
	poll(t, 10*time.Second, "the screen to change", func() bool {
		b, err := c.Screenshot(ctx, sb.ID)
		return err == nil && !bytes.Equal(b, before)
	})

	for name, a := range map[string]api.InputAction{
		"unknown action": {Type: "teleport"},
		"off screen":     client.Click(1024, 10, "left", 1),
		"negative":       client.Move(-1, 5),
		"bad key":        client.Key("ctrl+nokey"),
		"bad button":     client.Click(5, 5, "fourth", 1),
	} {
		if _, err := c.Input(ctx, sb.ID, a); !isInvalid(err) {
			t.Errorf("%s: want invalid, got %v", name, err)
		} else if !strings.Contains(err.Error(), "actions[0]") {
			t.Errorf("%s: message %q does not name the action", name, err)
		}
	}

	// A reset kills the desktop with every other process; the agent
	// starts it again.
	if _, err := c.Reset(ctx, sb.ID); err != nil {
		t.Fatalf("reset: %v", err)
	}
	waitTerminal()

	plain := newSandbox(t, c, nil)
	if _, err := c.Screenshot(ctx, plain.ID); !isInvalid(err) || !strings.Contains(err.Error(), "no screen") {
		t.Fatalf("screenshot of a container without X: %v", err)
	}
	if g, err := c.GetSandbox(ctx, plain.ID); err != nil || g.Display != nil {
		t.Fatalf("plain sandbox display: %+v, %v", g, err)
	}
	if err := c.DeleteSandbox(ctx, plain.ID); err != nil {
		t.Fatal(err)
	}
	desktop := sandboxProcesses(sb.ID, "Xvfb", "xterm")
	if len(desktop) < 2 {
		t.Fatalf("the desktop's processes on the host: %v", desktop)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	testutil.RequireNoSandboxLeft(t, s)
	poll(t, 10*time.Second, "the desktop's processes to end", func() bool {
		return len(sandboxProcesses(sb.ID, "Xvfb", "xterm")) == 0
	})
}

// sandboxProcesses lists the live host processes of a sandbox (their
// environment holds DSEC_SANDBOX_ID=id) named one of names.
func sandboxProcesses(id string, names ...string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil || !slices.Contains(names, strings.TrimSpace(string(comm))) {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(env, []byte("DSEC_SANDBOX_ID="+id+"\x00")) {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && strings.Contains(string(st), ") Z ") {
			continue
		}
		out = append(out, e.Name()+" "+strings.TrimSpace(string(comm)))
	}
	return out
}

// dumpProcesses logs a sandbox's background processes and their output
// (the autostarted desktop's, when it does not come up).
func dumpProcesses(t *testing.T, c *client.Client, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ps, err := c.ListProcesses(ctx, id)
	if err != nil {
		t.Logf("processes: %v", err)
		return
	}
	for _, p := range ps {
		for _, stream := range []string{"stdout", "stderr"} {
			o, err := c.ReadOutput(ctx, id, p.ID, stream, 0)
			if err == nil {
				t.Logf("process %s %s (running %v) %s:\n%s", p.ID, p.Tag, p.Running, stream, o.Data)
			}
		}
	}
}
