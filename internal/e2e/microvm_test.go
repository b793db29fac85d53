package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"

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
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
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
