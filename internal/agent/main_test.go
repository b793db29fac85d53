package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/testutil"
)

// agentBin is the dsec-agent binary under test, built once by TestMain.
// The agent must run as its own process: it reaps every child of the
// process it runs in, which would rob the test binary's exec.Cmds.
var agentBin string

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dsec-agent-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	agentBin = filepath.Join(dir, "dsec-agent")
	args := []string{"build", "-o", agentBin}
	env := os.Environ()
	if raceEnabled() {
		args = append(args, "-race") // so the agent's own races fail the tests too
	} else {
		env = append(env, "CGO_ENABLED=0")
	}
	cmd := exec.Command("go", append(args, "github.com/dsec-project/dsec/cmd/dsec-agent")...)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build dsec-agent: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

// testAgent is a running dsec-agent and a client connected to it.
type testAgent struct {
	*agent.Client
	t    *testing.T
	cmd  *exec.Cmd
	root string // its --root
	sock string // its socket
	logs *lockedBuffer
	done chan struct{} // closed once it has exited
	err  error         // its exit, once done
}

// startAgent runs an agent on a fresh socket with a fresh root; args are
// extra flags. It is stopped with SIGTERM when the test ends and must then
// exit 0 without a data race.
func startAgent(t *testing.T, args ...string) *testAgent {
	t.Helper()
	testutil.Require(t, testutil.Tool("sh"), testutil.Tool("sleep"))
	sock := shortTempDir(t) + "/agent.sock"
	root := t.TempDir()
	cmd := exec.Command(agentBin, append([]string{"--listen", sock, "--root", root}, args...)...)
	return runAgent(t, cmd, sock, root)
}

func runAgent(t *testing.T, cmd *exec.Cmd, sock, root string) *testAgent {
	t.Helper()
	a := &testAgent{
		t:    t,
		cmd:  cmd,
		root: root,
		sock: sock,
		logs: &lockedBuffer{},
		done: make(chan struct{}),
		Client: agent.NewClient(func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}),
	}
	cmd.Stderr = a.logs
	if _, ok := os.LookupEnv("GORACE"); !ok {
		// A race-enabled agent otherwise sleeps a second on exit.
		cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=100")
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start agent: %v", err)
	}
	go func() {
		a.err = cmd.Wait()
		close(a.done)
	}()
	t.Cleanup(a.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err := a.Health(ctx); err == nil {
			return a
		}
		select {
		case <-a.done:
			t.Fatalf("agent exited at start: %v\n%s", a.err, a.logs)
		case <-ctx.Done():
			t.Fatalf("agent did not become healthy\n%s", a.logs)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM and checks the agent exits cleanly.
func (a *testAgent) stop() {
	a.Close()
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
		a.t.Errorf("agent did not stop on SIGTERM")
	}
	if a.err != nil {
		a.t.Errorf("agent exited with %v", a.err)
	}
	if strings.Contains(a.logs.String(), "DATA RACE") {
		a.t.Errorf("data race in the agent")
	}
	if a.t.Failed() {
		a.t.Logf("agent log:\n%s", a.logs)
	}
}

func (a *testAgent) pid() int { return a.cmd.Process.Pid }

// do sends a raw request and returns the response with its body read.
func (a *testAgent) do(method, target string, body io.Reader) (*http.Response, []byte) {
	a.t.Helper()
	req, err := http.NewRequest(method, target, body)
	if err != nil {
		a.t.Fatal(err)
	}
	resp, err := a.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatalf("%s %s: read body: %v", method, target, err)
	}
	return resp, b
}

// wantError checks a response is the error code with its status.
func wantError(t *testing.T, resp *http.Response, body []byte, code string) {
	t.Helper()
	var er api.ErrorResponse
	if err := json.Unmarshal(body, &er); err != nil || er.Error == nil {
		t.Fatalf("status %d, body %q: not an error response", resp.StatusCode, body)
	}
	if er.Error.Code != code || resp.StatusCode != api.HTTPStatus(code) {
		t.Fatalf("got %d %s (%s), want %d %s", resp.StatusCode, er.Error.Code, er.Error.Message, api.HTTPStatus(code), code)
	}
}

func wantStatus(t *testing.T, resp *http.Response, body []byte, status int) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %q", resp.StatusCode, status, body)
	}
}

func decode[T any](t *testing.T, body []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("decode %q: %v", body, err)
	}
	return v
}

// shortTempDir is a temporary directory with a path short enough for a
// unix socket.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dsec")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// eventually polls cond until it holds, failing the test after a generous
// bound; it states that something happens, not how fast.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyTrue(t, 30*time.Second, what, cond)
}

// procStatus returns fields of /proc/<pid>/status; ok is false if the
// process is gone.
func procStatus(pid int) (map[string]string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, false
	}
	m := make(map[string]string)
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m, true
}

// dead reports whether pid has exited (gone, or a zombie not yet reaped).
func dead(pid int) bool {
	st, ok := procStatus(pid)
	return !ok || strings.HasPrefix(st["State"], "Z")
}

// gone reports whether pid has exited and been reaped.
func gone(pid int) bool {
	_, ok := procStatus(pid)
	return !ok
}

func atoiList(t *testing.T, s string) []int {
	t.Helper()
	var ns []int
	for f := range strings.FieldsSeq(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("not a pid list: %q", s)
		}
		ns = append(ns, n)
	}
	return ns
}

// killAtEnd kills leftover processes before the agent stops, while it can
// still reap them.
func killAtEnd(t *testing.T, pids ...int) {
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var errStop = errors.New("stop")
