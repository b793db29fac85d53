package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestMicroVM runs a microvm sandbox through the real server: the same
// API as a container, a guest kernel of its own, files, reset, and a
// server killed with SIGKILL and started again, after which the VM (not a
// child of the server) is still there with its state; nothing is left
// behind.
func TestMicroVM(t *testing.T) {
	testutil.Require(t, testutil.MicroVMRequirements...)
	s := startServer(t, "--microvm", "on")
	c := s.Client
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{
		Backend: api.BackendMicroVM, Layers: &api.LayerRefs{Base: "base:minimal"},
		Resources: api.Resources{CPU: 1, MemoryMB: 256, DiskMB: 512}, Env: map[string]string{"TURN": "1"},
	})
	if err != nil {
		t.Fatalf("create microvm sandbox: %v", err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	if sb.Backend != api.BackendMicroVM || sb.State != api.StateRunning {
		t.Fatalf("created %+v", sb)
	}
	var host syscall.Utsname
	syscall.Uname(&host)
	if out := strings.TrimSpace(sh(t, c, sb.ID, "uname -r")); out == "" || strings.HasPrefix(string(int8sToBytes(host.Release[:])), out) {
		t.Fatalf("uname -r in the guest: %q, host %q", out, int8sToBytes(host.Release[:]))
	}
	if out := sh(t, c, sb.ID, "echo $TURN > /kept; cat /kept"); out != "1\n" {
		t.Fatalf("env and files: %q", out)
	}
	if err := c.WriteFile(ctx, sb.ID, "/up.txt", strings.NewReader("uploaded"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := sh(t, c, sb.ID, "cat /up.txt"); out != "uploaded" {
		t.Fatalf("uploaded file: %q", out)
	}

	t.Run("exec streams, times out and caps output over the VM link", func(t *testing.T) {
		var lines []string
		res, err := c.ExecStream(ctx, sb.ID, &api.ExecRequest{Shell: "for i in 1 2 3; do echo line $i; sleep 0.2; done"},
			func(ev api.ExecEvent) error {
				if ev.Stdout != nil {
					lines = append(lines, *ev.Stdout)
				}
				return nil
			})
		if err != nil || res.ExitCode != 0 || strings.Join(lines, "") != "line 1\nline 2\nline 3\n" {
			t.Fatalf("stream: %+v %v %q", res, err, lines)
		}
		res, err = c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "sleep 30", TimeoutMs: 500})
		if err != nil || !res.TimedOut {
			t.Fatalf("timeout: %+v %v", res, err)
		}
		res, err = c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "yes | head -c 1000000", MaxOutputBytes: 1000})
		if err != nil || !res.Truncated || res.StdoutDropped == 0 || len(res.Stdout) > 1000 {
			t.Fatalf("output cap: truncated %v, dropped %d, kept %d: %v", res.Truncated, res.StdoutDropped, len(res.Stdout), err)
		}
	})

	s.Kill()
	s.Restart()
	c = s.Client
	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != api.StateRunning {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if out := sh(t, c, sb.ID, "cat /kept"); out != "1\n" {
		t.Fatalf("state after restart: %q", out)
	}

	if _, err := c.Reset(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if out := sh(t, c, sb.ID, "test -e /kept && echo dirty || echo clean"); out != "clean\n" {
		t.Fatalf("after reset: %q", out)
	}
	// The lease ends: the reaper destroys the VM like any sandbox.
	if _, err := c.Renew(ctx, sb.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the VM deleted after its lease ended", func() error {
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil || got.State != api.StateDeleted {
			return fmt.Errorf("%+v %v", got, err)
		}
		return nil
	})
	testutil.RequireNoSandboxLeft(t, s)
}

func int8sToBytes(a []int8) []byte {
	var b []byte
	for _, c := range a {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return b
}
