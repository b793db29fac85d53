package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/testutil"
)

// agentConns counts a fake agent's connections.
type agentConns struct{ opened, closed atomic.Int64 }

// fakeAgent serves h on a unix socket, closing connections idle for
// idle (if not 0), and counts its connections. The counts are its own: an
// earlier test's server may still report its connections closed.
func fakeAgent(t *testing.T, idle time.Duration, h http.HandlerFunc) (*Client, *agentConns) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "a.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var conns agentConns
	srv := &http.Server{Handler: h, IdleTimeout: idle, ConnState: func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			conns.opened.Add(1)
		case http.StateClosed:
			conns.closed.Add(1)
		}
	}}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(c.Close)
	return c, &conns
}

// TestInlineExecsKeepOneConnection: execs one after another go over one
// kept connection, sent from the caller's goroutine; an NDJSON stream
// comes through whole; other calls go through the regular transport.
func TestInlineExecsKeepOneConnection(t *testing.T) {
	c, conns := fakeAgent(t, 0, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/exec" {
			writeJSON(w, http.StatusOK, &Health{OK: true})
			return
		}
		var req api.ExecRequest
		if err := decodeJSON(w, r, &req, maxExecBody); err != nil || len(req.Cmd) == 0 {
			writeJSON(w, http.StatusBadRequest, &api.ErrorResponse{Error: &api.Error{Code: api.CodeInvalid, Message: "cmd is required"}})
			return
		}
		if acceptsNDJSON(r) {
			w.Header().Set("Content-Type", ndjson)
			io.WriteString(w, `{"stdout":"a"}`+"\n")
			http.NewResponseController(w).Flush()
			io.WriteString(w, `{"exit":{"exit_code":3}}`+"\n")
			return
		}
		writeJSON(w, http.StatusOK, &api.ExecResult{Stdout: strings.Join(req.Cmd, " ")})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 50 {
		res, err := c.Exec(ctx, &api.ExecRequest{Cmd: []string{"echo", "hi"}})
		if err != nil || res.Stdout != "echo hi" {
			t.Fatalf("exec: %+v, %v", res, err)
		}
	}
	var out string
	res, err := c.ExecStream(ctx, &api.ExecRequest{Cmd: []string{"x"}}, func(ev api.ExecEvent) error {
		if ev.Stdout != nil {
			out += *ev.Stdout
		}
		return nil
	})
	if err != nil || res.ExitCode != 3 || out != "a" {
		t.Fatalf("stream: %+v %q, %v", res, out, err)
	}
	// A caller's Expect: 100-continue (curl's, passed on by the proxies)
	// does not make the agent's 100 Continue pass for the answer.
	hreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, "/exec", strings.NewReader(`{"cmd":["a","b"]}`))
	hreq.Header.Set("Expect", "100-continue")
	resp, err := c.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"stdout":"a b"`) {
		t.Fatalf("exec with Expect: %d %s, %v", resp.StatusCode, b, err)
	}
	if _, err := c.Exec(ctx, &api.ExecRequest{}); err == nil || !strings.Contains(err.Error(), "cmd is required") {
		t.Fatalf("a refused exec: %v", err)
	}
	if n, d := conns.opened.Load(), c.inline.dials; n != 1 || d != 1 {
		t.Fatalf("52 execs and a refusal opened %d connections (%d dials), want 1", n, d)
	}
	if _, err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if n := conns.opened.Load(); n != 2 {
		t.Fatalf("after a health call %d connections, want 2 (execs' and the others')", n)
	}
}

// TestInlineExecAfterTheAgentClosedTheConnection: a kept connection the
// agent closed (an idle timeout, a reset's re-exec) is not used; the exec
// goes on a new one.
func TestInlineExecAfterTheAgentClosedTheConnection(t *testing.T) {
	c, conns := fakeAgent(t, time.Millisecond, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeJSON(w, http.StatusOK, &api.ExecResult{ExitCode: 0})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 5 {
		closed := conns.closed.Load()
		if _, err := c.Exec(ctx, &api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			t.Fatalf("exec %d: %v", i, err)
		}
		// Past the idle timeout: the agent closes it.
		testutil.Eventually(t, 30*time.Second, "the agent closed the idle connection", func() error {
			if conns.closed.Load() == closed {
				return errors.New("still open")
			}
			return nil
		})
	}
	if n := conns.opened.Load(); n != 5 {
		t.Fatalf("%d connections, want one per exec", n)
	}
}

// TestInlineExecCanceled: a caller that gives up closes the connection,
// which tells the agent to kill the command, and gets its context's error.
func TestInlineExecCanceled(t *testing.T) {
	gone := make(chan struct{})
	c, _ := fakeAgent(t, 0, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
			close(gone)
		case <-time.After(30 * time.Second):
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Exec(ctx, &api.ExecRequest{Cmd: []string{"sleep", "60"}})
	if err == nil || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
		t.Fatalf("exec past its deadline: %v", err)
	}
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not see its caller leave")
	}
}
