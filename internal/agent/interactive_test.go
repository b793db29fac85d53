package agent_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/internal/testutil"
)

// agentState is what leaks would show in the agent's process: its open
// descriptors, its threads and its children.
func (a *testAgent) state(t *testing.T) (fds, threads, children int) {
	t.Helper()
	pid := a.cmd.Process.Pid
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			threads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	// The children of the agent's threads, from the kernel: not a scan of
	// every process on the machine, whose /proc files can block on a
	// process stuck in another test's file system.
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, e := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, e.Name()))
		if err != nil {
			continue
		}
		children += len(strings.Fields(string(b)))
	}
	return len(ents), threads, children
}

func (a *testAgent) dialWS(ctx context.Context, target string) (*websocket.Conn, error) {
	conn, _, err := websocket.Dial(ctx, "ws://agent"+target, &websocket.DialOptions{HTTPClient: &http.Client{Transport: a.Transport()}})
	return conn, err
}

// TestInteractiveNoLeaks opens and drops 1,000 terminals and 1,000 port
// connections (proxied requests and tunnels, half of them cut mid-way) and
// checks that the agent is left with no more descriptors than it had
// (each live terminal or connection holds at least one) and no children
// (the terminals' shells and the jobs they started are killed).
func TestInteractiveNoLeaks(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()
	// A service on the host's loopback: the test agent shares the host's
	// network namespace.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			w.Write([]byte("partial"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		io.WriteString(w, "ok")
	}))

	// Warm up: the first of each kind starts what stays (the spawner
	// thread, the transport).
	one := func(i int) {
		t.Helper()
		term, err := a.dialWS(ctx, "/terminal?cmd=/bin/sh")
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			term.Write(ctx, websocket.MessageBinary, []byte("sleep 100 & sleep 100\n"))
		}
		term.CloseNow()
		tun, err := a.dialWS(ctx, "/tcp/"+strconv.Itoa(port))
		if err != nil {
			t.Fatal(err)
		}
		nc := websocket.NetConn(ctx, tun, websocket.MessageBinary)
		fmt.Fprintf(nc, "GET / HTTP/1.0\r\n\r\n")
		nc.Close()
		path := "/"
		if i%2 == 0 {
			path = "/slow"
		}
		rctx, cancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(rctx, "GET", fmt.Sprintf("/ports/%d%s", port, path), nil)
		resp, err := a.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 2)
		io.ReadFull(resp.Body, b)
		cancel()
		resp.Body.Close()
	}
	for i := range 4 {
		one(i)
	}
	settle := func() (int, int, int) {
		var f, th, ch int
		_ = testutil.Poll(10*time.Second, func() error {
			if f, th, ch = a.state(t); ch != 0 {
				return fmt.Errorf("%d children", ch)
			}
			return nil
		})
		return f, th, ch
	}
	a.Client.Close()
	fds0, threads0, _ := settle()
	for i := range 1000 {
		one(i)
	}
	a.Client.Close()
	var fds, threads, children int
	_ = testutil.Poll(60*time.Second, func() error {
		if fds, threads, children = settle(); fds > fds0 || children != 0 {
			return fmt.Errorf("%d fds, %d children", fds, children)
		}
		return nil
	})
	// Threads are not checked: Go keeps the OS threads it once needed.
	if fds > fds0 || children != 0 {
		t.Fatalf("after 1,000 dropped terminals and port connections: %d fds (was %d), %d threads (was %d), %d children",
			fds, fds0, threads, threads0, children)
	}
	t.Logf("agent: %d fds, %d threads (before: %d, %d)", fds, threads, fds0, threads0)
}
