package agent_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/testutil"
)

func TestHealth(t *testing.T) {
	a := startAgent(t)
	h, err := a.Health(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !h.OK || h.Pid != a.pid() || h.Version == "" {
		t.Errorf("health %+v, want ok with pid %d", h, a.pid())
	}
}

func TestListenFD(t *testing.T) {
	sock := shortTempDir(t) + "/edge.sock"
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	cmd := exec.Command(agentBin, "--listen-fd", "3", "--root", root)
	cmd.ExtraFiles = []*os.File{f}
	a := runAgent(t, cmd, sock, root)
	// The agent holds the only copy of the socket from now on.
	f.Close()
	l.SetUnlinkOnClose(false)
	l.Close()

	t.Run("children inherit no agent fd", func(t *testing.T) {
		res, err := a.Exec(t.Context(), &api.ExecRequest{Shell: `for f in /proc/$$/fd/*; do echo "$f $(readlink $f)"; done`})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(res.Stdout, "socket:") {
			t.Errorf("a socket leaked into the command:\n%s", res.Stdout)
		}
	})
}

func TestNotDumpable(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("setpriv"), testutil.Tool("readlink"))
	// As in a container, the agent and the sandboxed processes share a uid
	// and a capability set without CAP_SYS_PTRACE. A process may then look
	// at the fds of another such process (the control) but not the agent's.
	sock := shortTempDir(t) + "/agent.sock"
	root := t.TempDir()
	noPtrace := []string{"--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"}
	cmd := exec.Command("setpriv", append(noPtrace, agentBin, "--listen", sock, "--root", root)...)
	a := runAgent(t, cmd, sock, root)
	// fd 2: the shell points a background command's stdin at /dev/null
	// after its fork, so its fd 0 may be missing for a moment (seen
	// under load); its stderr is inherited and always there.
	res, err := a.Exec(t.Context(), &api.ExecRequest{Shell: fmt.Sprintf(
		"sleep 1000 & readlink /proc/$!/fd/2 && echo control-ok; kill $!; readlink /proc/%d/fd/2", a.pid())})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(res.Stdout, "control-ok\n") || res.ExitCode == 0 {
		t.Errorf("exit %d, stdout %q, stderr %q: want the agent's fds hidden", res.ExitCode, res.Stdout, res.Stderr)
	}
}

// children lists the processes whose parent is pid, with their state.
func children(pid int) map[int]string {
	kids := make(map[int]string)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := procStatus(n); ok && st["PPid"] == strconv.Itoa(pid) {
			kids[n] = st["State"]
		}
	}
	return kids
}

func TestReapsOrphans(t *testing.T) {
	a := startAgent(t)
	gate := filepath.Join(t.TempDir(), "gate")
	const orphans = 20
	// Each subshell exits at once, orphaning its background sh, which the
	// agent adopts as a subreaper (or as PID 1).
	res, err := a.Exec(t.Context(), &api.ExecRequest{Shell: fmt.Sprintf(
		"i=0; while [ $i -lt %d ]; do (sh -c 'while [ ! -e %s ]; do sleep 0.01; done' &); i=$((i+1)); done", orphans, gate)})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %v %+v", err, res)
	}
	eventually(t, "the agent adopts the orphans", func() bool { return len(children(a.pid())) >= orphans })
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the orphans are reaped, not left as zombies", func() bool {
		kids := children(a.pid())
		return len(kids) == 0
	})
}

func TestShutdownForwardsSignals(t *testing.T) {
	a := startAgent(t, "--shutdown-grace", "500ms")
	dir := t.TempDir()
	handled := filepath.Join(dir, "handled")
	// One process exits on TERM; the other ignores it and must be killed.
	a.startBackground(t, api.ExecRequest{Shell: fmt.Sprintf("trap 'echo term > %s; exit 0' TERM; echo ready; while :; do sleep 0.01; done", handled)})
	stubborn := a.startBackground(t, api.ExecRequest{Shell: "trap '' TERM; echo ready; while :; do sleep 0.01; done"})
	eventually(t, "both run", func() bool {
		return a.process(t, "/procs/p-1").OutputSize > 0 && a.process(t, "/procs/"+stubborn.ID).OutputSize > 0
	})

	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not exit")
	}
	if a.err != nil {
		t.Fatalf("agent exited with %v, want 0", a.err)
	}
	if b, err := os.ReadFile(handled); err != nil || string(b) != "term\n" {
		t.Errorf("the TERM handler did not run: %q %v", b, err)
	}
	// The agent sent SIGKILL before it exited; on a loaded machine the
	// process may take a moment to die.
	if testutil.Poll(10*time.Second, func() error {
		if !dead(stubborn.Pid) {
			return fmt.Errorf("pid %d alive", stubborn.Pid)
		}
		return nil
	}) != nil {
		_ = syscall.Kill(-stubborn.Pid, syscall.SIGKILL)
		t.Errorf("a process ignoring TERM outlived the agent")
	}
}
