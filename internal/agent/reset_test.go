package agent_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
)

// TestResetRefusedOutsideAContainer: an agent that is not PID 1 of a
// container must refuse a reset — and above all never kill(-1) — and
// close the descriptors it was sent. (The reset itself is tested through
// the container backend: internal/backend/container TestResetInPlace.)
func TestResetRefusedOutsideAContainer(t *testing.T) {
	a := startAgent(t)
	bg, err := a.Exec(t.Context(), &api.ExecRequest{Shell: "sleep 1000", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(t.TempDir(), "fd")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	conn, err := net.Dial("unix", a.sock)
	if err != nil {
		t.Fatal(err)
	}
	_, err = agent.ResetRoot(context.Background(), conn, int(f.Fd()), nil, nil)
	if !errors.Is(err, agent.ErrNoReset) || !strings.Contains(err.Error(), "PID 1") {
		t.Fatalf("reset of a test agent: %v", err)
	}
	if unix.Kill(bg.Process.Pid, 0) != nil {
		t.Fatal("the refused reset killed a process")
	}
	res, err := a.Exec(t.Context(), &api.ExecRequest{Shell: "echo ok"})
	if err != nil || res.Stdout != "ok\n" {
		t.Fatalf("the agent does not serve after a refused reset: %+v %v", res, err)
	}
	unix.Kill(bg.Process.Pid, unix.SIGKILL)
}
