package e2e

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// A microVM with the desktop toolkit has a screen served by the same
// agent code as a container's: the guest's agent starts the toolkit's X
// server and terminal, the screen shows it (not blank), text typed into
// the terminal runs in the guest's shell and writes a file that exec
// reads back, and the screen changes; nothing is left behind. Lean on
// purpose (no reset, no bad input: TestDesktopContainer covers those for
// the shared code): a microVM boot under TCG is most of its time.
func TestDesktopMicroVM(t *testing.T) {
	testutil.Require(t, append([]testutil.Requirement{testutil.Tool("Xvfb"), testutil.Tool("xterm"),
		testutil.Tool("python3"), testutil.Tool("dpkg-query")}, testutil.MicroVMRequirements...)...)
	s := startServer(t, "--microvm", "on")
	c := s.Client
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	buildDesktopToolkit(ctx, t, s)
	start := time.Now()
	sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{
		Backend:   api.BackendMicroVM,
		Layers:    &api.LayerRefs{Base: "base:minimal", Toolkit: desktopToolkit},
		Resources: api.Resources{CPU: 1, MemoryMB: 256, DiskMB: 512},
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	t.Logf("microVM created in %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			dumpProcesses(t, c, sb.ID)
		}
	})

	var before []byte
	poll(t, 60*time.Second, "the terminal on the microVM's screen", func() bool {
		b, err := c.Screenshot(ctx, sb.ID)
		if err != nil && !isInvalid(err) { // before the X server is up: no screen yet
			t.Fatalf("screenshot: %v", err)
		}
		before = b
		return err == nil && pngColours(t, b) >= 2
	})
	t.Logf("first screenshot %s after the create began", time.Since(start).Round(time.Millisecond))
	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || got.Display == nil || got.Display.Width != 1024 || got.Display.Height != 768 {
		t.Fatalf("sandbox display: %+v, %v", got.Display, err)
	}

	res, err := c.Input(ctx, sb.ID, client.Click(200, 200, "left", 1), client.Type("echo typed > /tmp/t\n"))
	if err != nil || res.Done != 2 {
		t.Fatalf("input: %+v, %v", res, err)
	}
	poll(t, 30*time.Second, "the typed command's file in the guest", func() bool {
		r, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"cat", "/tmp/t"}})
		return err == nil && r.ExitCode == 0 && r.Stdout == "typed\n"
	})
	poll(t, 15*time.Second, "the microVM's screen to change", func() bool {
		b, err := c.Screenshot(ctx, sb.ID)
		return err == nil && !bytes.Equal(b, before)
	})
	if _, err := c.Input(ctx, sb.ID, api.InputAction{Type: "teleport"}); !isInvalid(err) {
		t.Errorf("unknown action: want invalid, got %v", err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	testutil.RequireNoSandboxLeft(t, s)
	t.Logf("whole test body %s", time.Since(start).Round(time.Millisecond))
}
