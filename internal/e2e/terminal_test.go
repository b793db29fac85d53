package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestShellUnderTmux drives `dsec sandbox shell` in a real tmux: a
// full-screen editor saves a file, a window resize changes `stty size`
// inside, Ctrl-C interrupts a sleep and the shell stays, and the shell's
// exit code is the CLI's.
func TestShellUnderTmux(t *testing.T) {
	testutil.Require(t, testutil.Tool("tmux"))
	s := startServer(t)
	sb := newSandbox(t, s.Client, nil)
	dsec := filepath.Join(testutil.Binaries(t), "dsec")
	sock := fmt.Sprintf("dsec-test-%d", time.Now().UnixNano())
	tmux := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("tmux", append([]string{"-L", sock}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	shell := fmt.Sprintf("DSEC_URL=%s DSEC_API_KEY=%s %s sandbox shell %s; echo EXIT=$?; sleep 600", s.URL, s.Key, dsec, sb.ID)
	tmux("new-session", "-d", "-x", "100", "-y", "30", shell)
	t.Cleanup(func() { exec.Command("tmux", "-L", sock, "kill-server").Run() })
	// pane waits until the pane's text, without trailing blanks, matches
	// re and returns it.
	pane := func(re string) string {
		t.Helper()
		rx := regexp.MustCompile(re)
		var text string
		if testutil.Poll(60*time.Second, func() error {
			if text = strings.TrimRight(tmux("capture-pane", "-p", "-J"), " \n"); !rx.MatchString(text) {
				return errors.New("no match")
			}
			return nil
		}) != nil {
			t.Fatalf("pane never matched %q:\n%s", re, text)
		}
		return text
	}
	pane(`/ #$`)
	tmux("send-keys", "stty size", "Enter")
	pane(`(?m)^30 100\s*$`)

	tmux("resize-window", "-x", "120", "-y", "40")
	tmux("send-keys", "clear; stty size", "Enter")
	pane(`(?m)^40 120\s*$`)

	tmux("send-keys", "clear; sleep 1000", "Enter")
	eventually(t, 30*time.Second, func() bool {
		r, err := s.Client.Exec(ctxT(t), sb.ID, &api.ExecRequest{Shell: "ps | grep -q '[s]leep 1000'"})
		return err == nil && r.ExitCode == 0
	})
	tmux("send-keys", "C-c")
	pane(`\^C\s*\n/ #$`)
	tmux("send-keys", "clear; echo still-$((40+2))", "Enter")
	pane(`(?m)^still-42\s*$`)

	tmux("send-keys", "clear; vi /tmp/edited.txt", "Enter")
	pane(`/tmp/edited.txt`)
	tmux("send-keys", "i", "typed in vi")
	pane(`typed in vi`)
	// Escape alone: followed at once by ":", vi would read an escape
	// sequence.
	tmux("send-keys", "Escape")
	// sleep: a typist's pause after Escape, longer than vi's escape-sequence timeout, not a wait for a result
	time.Sleep(300 * time.Millisecond)
	tmux("send-keys", ":wq", "Enter")
	pane(`/ #$`)
	if got := sh(t, s.Client, sb.ID, "cat /tmp/edited.txt"); got != "typed in vi\n" {
		t.Fatalf("file saved by vi: %q", got)
	}
	// Keys typed while the shell takes the terminal back from vi may be
	// flushed by its own tcsetattr (busybox ash), as on any terminal: type
	// a probe until the shell echoes it, then go on.
	ready := regexp.MustCompile(`(?m)^ready-2\s*$`)
	eventually(t, 60*time.Second, func() bool {
		tmux("send-keys", "clear; echo ready-$((1+1))", "Enter")
		return testutil.Poll(2*time.Second, func() error {
			if !ready.MatchString(tmux("capture-pane", "-p", "-J")) {
				return errors.New("no probe echoed")
			}
			return nil
		}) == nil
	})
	tmux("send-keys", "exit 7", "Enter")
	pane(`(?m)^EXIT=7\s*$`)
}

// TestTerminalAPI uses the Go client's terminal and a tty exec on a
// container and, where it can run, a microVM.
func TestTerminalAPI(t *testing.T) {
	s := startServer(t, "--microvm", "on")
	t.Run("container", func(t *testing.T) {
		testTerminal(t, s.Client, newSandbox(t, s.Client, nil).ID)
	})
	t.Run("microvm", func(t *testing.T) {
		testutil.Require(t, testutil.MicroVMRequirements...)
		sb, err := s.Client.CreateSandbox(ctxT(t), &api.CreateSandboxRequest{
			Backend: api.BackendMicroVM, Layers: &api.LayerRefs{Base: "base:minimal"},
			Resources: api.Resources{CPU: 1, MemoryMB: 256, DiskMB: 512},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Client.DeleteSandbox(context.Background(), sb.ID) })
		testTerminal(t, s.Client, sb.ID)
	})
}

func testTerminal(t *testing.T, c *client.Client, id string) {
	ctx := ctxT(t)
	res, err := c.Exec(ctx, id, &api.ExecRequest{Shell: "tty >/dev/null && stty size; echo err >&2", TTY: &api.TTYSize{Rows: 5, Cols: 7}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "5 7\r\nerr\r\n" || res.Stderr != "" || res.ExitCode != 0 {
		t.Fatalf("tty exec: %+v", res)
	}
	for _, size := range []api.TTYSize{{Rows: 0, Cols: 80}, {Rows: 24, Cols: 100000}} {
		if _, err := c.Exec(ctx, id, &api.ExecRequest{Shell: "true", TTY: &size}); !client.IsInvalid(err) {
			t.Fatalf("exec with tty %+v: %v, want invalid", size, err)
		}
	}
	for _, size := range []api.TTYSize{{Rows: -1, Cols: 80}, {Rows: 24, Cols: 100000}} {
		if _, err := c.Terminal(ctx, id, client.TerminalOptions{Rows: size.Rows, Cols: size.Cols}); !client.IsInvalid(err) {
			t.Fatalf("terminal %+v: %v, want invalid", size, err)
		}
	}

	term, err := c.Terminal(ctx, id, client.TerminalOptions{Cmd: []string{"/bin/sh"}, Rows: 10, Cols: 50, Env: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	out := &termReader{t: t, term: term}
	io.WriteString(term, "echo $GREETING-$((6*7)); stty size\n")
	out.expect(`hi-42\r\n10 50\r\n`)
	if err := term.Resize(33, 77); err != nil {
		t.Fatal(err)
	}
	io.WriteString(term, "stty size\n")
	out.expect(`33 77\r\n`)
	io.WriteString(term, "sleep 1000\n")
	// The sleep must have started before it is signalled: ask the
	// sandbox.
	eventually(t, 30*time.Second, func() bool {
		r, err := c.Exec(ctx, id, &api.ExecRequest{Shell: "ps | grep -q '[s]leep 1000'"})
		return err == nil && r.ExitCode == 0
	})
	if err := term.Signal("INT"); err != nil {
		t.Fatal(err)
	}
	io.WriteString(term, "echo after-$?\n")
	out.expect(`after-130`)
	io.WriteString(term, "exit 5\n")
	out.expectEOF()
	if code, _, ok := term.Exit(); !ok || code != 5 {
		t.Fatalf("exit %d %v, want 5", code, ok)
	}

	// A bad control message closes the terminal with a reason.
	term2, err := c.Terminal(ctx, id, client.TerminalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer term2.Close()
	if err := term2.Resize(0, 10); err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, term2)
	if !client.IsInvalid(err) || !strings.Contains(err.Error(), "rows and cols") {
		t.Fatalf("terminal after a resize to 0x10: %v, want invalid with a reason", err)
	}

	// A command that is not there: exit 127, as a shell says.
	term3, err := c.Terminal(ctx, id, client.TerminalOptions{Cmd: []string{"no-such-command"}})
	if err != nil {
		t.Fatal(err)
	}
	defer term3.Close()
	b, err := io.ReadAll(term3)
	if code, _, _ := term3.Exit(); err != nil || code != 127 || !bytes.Contains(b, []byte("not found")) {
		t.Fatalf("terminal of a missing command: %q %v exit %d", b, err, code)
	}
}

// termReader reads a terminal's output until it matches.
type termReader struct {
	t    *testing.T
	term *client.Terminal
	buf  bytes.Buffer
}

func (r *termReader) expect(re string) {
	r.t.Helper()
	rx := regexp.MustCompile(re)
	done := make(chan error, 1)
	go func() {
		p := make([]byte, 4096)
		for !rx.Match(r.buf.Bytes()) {
			n, err := r.term.Read(p)
			r.buf.Write(p[:n])
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			r.t.Fatalf("terminal output %q never matched %q: %v", r.buf.String(), re, err)
		}
	case <-time.After(60 * time.Second):
		r.t.Fatalf("terminal output %q never matched %q", r.buf.String(), re)
	}
	r.buf.Reset()
}

func (r *termReader) expectEOF() {
	r.t.Helper()
	_, err := io.Copy(&r.buf, r.term)
	if err != nil && !errors.Is(err, io.EOF) {
		r.t.Fatalf("terminal: %v", err)
	}
}

// eventually polls cond until it holds, failing the test after d.
func eventually(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	testutil.EventuallyTrue(t, d, "the condition met", cond)
}

// TestLogsFollow follows a background process through the server with
// the Go client and `dsec sandbox logs -f`, from a second tenant key too.
func TestLogsFollow(t *testing.T) {
	s := startServer(t)
	c := s.Client
	sb := newSandbox(t, c, nil)
	ctx := ctxT(t)
	res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Background: true,
		Shell: "echo one; echo err >&2; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo two; exit 4"})
	if err != nil {
		t.Fatal(err)
	}
	pid := res.Process.ID
	dsec := exec.Command(filepath.Join(testutil.Binaries(t), "dsec"), "sandbox", "logs", "-f", sb.ID, pid)
	dsec.Env = append(dsec.Environ(), "DSEC_URL="+s.URL, "DSEC_API_KEY="+s.Key)
	var stdout, stderr bytes.Buffer
	dsec.Stdout, dsec.Stderr = &stdout, &stderr
	if err := dsec.Start(); err != nil {
		t.Fatal(err)
	}
	// Without follow: what there is so far.
	eventually(t, 60*time.Second, func() bool {
		got := map[string]string{}
		_, err = c.ProcessLogs(ctx, sb.ID, pid, client.LogOptions{}, func(ev api.OutputEvent) error {
			b, err := client.OutputBytes(ev)
			got[ev.Stream] += string(b)
			return err
		})
		return err == nil && got["stdout"] == "one\n" && got["stderr"] == "err\n"
	})
	sh(t, c, sb.ID, "touch /tmp/go")
	var ee *exec.ExitError
	if err := dsec.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 4 {
		t.Fatalf("dsec sandbox logs -f: %v, stderr %q", err, stderr.String())
	}
	if stdout.String() != "one\ntwo\n" || stderr.String() != "err\n" {
		t.Fatalf("dsec sandbox logs -f: stdout %q stderr %q", stdout.String(), stderr.String())
	}
	exit, err := c.ProcessLogs(ctx, sb.ID, pid, client.LogOptions{Stream: "stdout", Offset: 4, Follow: true}, func(ev api.OutputEvent) error {
		if *ev.Data != "two\n" || ev.Offset != 4 {
			t.Errorf("from offset 4: %+v", ev)
		}
		return nil
	})
	if err != nil || exit == nil || exit.ExitCode != 4 {
		t.Fatalf("follow an exited process: %+v %v", exit, err)
	}
}
