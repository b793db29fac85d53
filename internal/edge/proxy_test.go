package edge_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/reqid"
)

// TestProxyAnswersBeforeTheBodyEnds: an agent answers once it has parsed
// the request, before the proxy has read the request body to its end. The
// proxy must go on reading the body while it copies the answer, and copy
// all of it: an HTTP/1 server that closes the body at the answer's first
// flush made the proxy's transport drop the connection mid-answer.
func TestProxyAnswersBeforeTheBodyEnds(t *testing.T) {
	const lines = 2000
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the request up to its closing brace, not to EOF.
		if _, err := bufio.NewReader(r.Body).ReadString('}'); err != nil {
			t.Errorf("agent: read request: %v", err)
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		rc.Flush()
		for i := range lines {
			fmt.Fprintf(w, "{\"line\":%d}\n", i)
			if i%100 == 0 {
				rc.Flush()
			}
		}
		io.Copy(io.Discard, r.Body) // as an HTTP server finishing the request would
	}))
	defer agent.Close()
	c, err := edge.NewClient(agent.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.ProxyAgent(w, r, "sb-1", "/exec")
	}))
	defer front.Close()

	// The request's body ends only after the answer has begun (or, if the
	// answer waits for it, after a while: then the test fails).
	body, bodyW := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, front.URL, body)
	answered := make(chan struct{})
	waited := make(chan bool, 1)
	go func() {
		bodyW.Write([]byte(`{"shell":"seq"}`))
		select {
		case <-answered:
			waited <- false
		case <-time.After(20 * time.Second):
			waited <- true
		}
		bodyW.Close()
	}()
	resp, err := http.DefaultClient.Do(req)
	close(answered)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if <-waited {
		t.Fatal("the proxy's answer waited for the request body to end")
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("answer cut after %d lines: %v", strings.Count(string(got), "\n"), err)
	}
	if n := strings.Count(string(got), "\n"); n != lines {
		t.Fatalf("answer has %d lines, want %d", n, lines)
	}
}

// frontServer serves c.ProxyAgent with the server's own log kept, so a
// test can look for the panics net/http recovers and logs. spy, if set,
// wraps each request body as the proxy gets it.
func frontServer(t *testing.T, c *edge.Client, spy func(io.ReadCloser) io.ReadCloser, done func()) (*httptest.Server, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	front := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if spy != nil {
			r.Body = spy(r.Body)
		}
		c.ProxyAgent(w, r, "sb-1", "/exec")
		if done != nil {
			done()
		}
	}))
	front.Config.ErrorLog = log.New(logs, "", 0)
	front.Start()
	t.Cleanup(front.Close)
	return front, logs
}

// TestProxyUnreadBodyKeepsTheServerWhole: an agent that cannot be reached
// leaves the request body unread. Go's HTTP/1 server then read the rest
// itself after the handler and, finding its end, started its read for the
// next request, which the next request's own read on the kept-alive
// connection ran into: "http: panic serving …: invalid concurrent
// Body.Read call" (golang/go#68560), recovered and logged by net/http,
// the connection dropped. Every answer must be a whole 503, in time, and
// the server must log no panic.
func TestProxyUnreadBodyKeepsTheServerWhole(t *testing.T) {
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close() // its address now refuses connections
	c, err := edge.NewClient(gone.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	front, logs := frontServer(t, c, nil, nil)
	client := &http.Client{Timeout: 10 * time.Second} // the old proxy waited 30 s for the body
	for i := range 20 {
		resp, err := client.Post(front.URL, "application/json", strings.NewReader(`{"shell":"true"}`))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "node unreachable") {
			t.Fatalf("request %d: %d %q %v", i, resp.StatusCode, b, err)
		}
	}
	if strings.Contains(logs.String(), "panic") {
		t.Fatalf("the server recovered a panic:\n%s", logs)
	}
}

// TestProxyStreamEndsWithItsAnswer: a stream whose request body stays open
// (stdin of a process) ends when the agent's answer ends, not when the
// client closes its body; the body is never read after the handler
// returned (its reads and the server's must not overlap), and the
// connection, whose rest of body is never read, is closed.
func TestProxyStreamEndsWithItsAnswer(t *testing.T) {
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		line, err := bufio.NewReader(r.Body).ReadString('\n')
		if err != nil {
			t.Errorf("agent: read stdin: %v", err)
			return
		}
		fmt.Fprintf(w, "got %s", line) // the process exits after one line
	}))
	defer agent.Close()
	c, err := edge.NewClient(agent.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	var returned atomic.Bool
	var late atomic.Int32
	spy := func(rc io.ReadCloser) io.ReadCloser {
		return lateReads{rc, &returned, &late}
	}
	front, logs := frontServer(t, c, spy, func() { returned.Store(true) })

	body, bodyW := io.Pipe()
	defer bodyW.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // the old proxy waited 30 s
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL, body)
	go bodyW.Write([]byte("hello\n"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(got) != "got hello\n" {
		t.Fatalf("answer %q, %v; want it whole while stdin is open", got, err)
	}
	if !resp.Close {
		t.Error("answer without Connection: close while its request body was unread")
	}
	// The client gives up its body once the connection is gone; until then
	// this write may be read by no one.
	if _, err := bodyW.Write([]byte("more\n")); err == nil {
		_, err = bodyW.Write([]byte("more\n"))
		t.Logf("second write: %v", err)
	}
	if n := late.Load(); n != 0 {
		t.Fatalf("the request body was read %d times after its handler returned", n)
	}
	if strings.Contains(logs.String(), "panic") {
		t.Fatalf("the server recovered a panic:\n%s", logs)
	}
}

// lateReads counts Reads that end after the handler returned.
type lateReads struct {
	io.ReadCloser
	returned *atomic.Bool
	late     *atomic.Int32
}

func (l lateReads) Read(p []byte) (int, error) {
	n, err := l.ReadCloser.Read(p)
	if l.returned.Load() {
		l.late.Add(1)
	}
	return n, err
}

// TestProxyKeepsExecConnections: plain requests (a JSON body with its
// length) keep their connection, one after another, and leave no panic.
func TestProxyKeepsExecConnections(t *testing.T) {
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	defer agent.Close()
	c, err := edge.NewClient(agent.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	front, logs := frontServer(t, c, nil, nil)
	client := &http.Client{Timeout: 10 * time.Second}
	reused := 0
	for i := range 50 {
		in := fmt.Sprintf(`{"shell":"echo %d"}`, i)
		req, _ := http.NewRequest(http.MethodPost, front.URL, strings.NewReader(in))
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(ci httptrace.GotConnInfo) {
				if ci.Reused {
					reused++
				}
			},
		}))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(out) != in {
			t.Fatalf("request %d: %q, %v", i, out, err)
		}
	}
	if reused < 45 {
		t.Errorf("%d of 50 requests reused a connection", reused)
	}
	if strings.Contains(logs.String(), "panic") {
		t.Fatalf("the server recovered a panic:\n%s", logs)
	}
}

// TestProxyAgentInProcess: a client WithLocal hands agent requests to the
// edge's handler in this process as the socket hop would present them
// (the edge's path, the query, its token instead of the caller's, the
// call's id), and the handler's streamed answer reaches the caller as it
// is written.
func TestProxyAgentInProcess(t *testing.T) {
	type seen struct{ path, query, auth, id, body string }
	got := make(chan seen, 1)
	local := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.URL.Path, r.URL.RawQuery, r.Header.Get("Authorization"), r.Header.Get(reqid.Header), string(b)}
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintln(w, `{"stdout":"a"}`)
		http.NewResponseController(w).Flush()
		fmt.Fprintln(w, `{"exit":{}}`)
	})
	c, err := edge.NewClient("unix:///nonexistent/edge.sock", "edge-token")
	if err != nil {
		t.Fatal(err)
	}
	c.WithLocal(local)
	front := httptest.NewServer(reqid.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.ProxyAgent(w, r, "sb-1", "/files")
	})))
	defer front.Close()
	req, _ := http.NewRequest(http.MethodPut, front.URL+"/v1/sandboxes/sb-1/files?path=%2Ftmp%2Fx", strings.NewReader("data"))
	req.Header.Set("Authorization", "Bearer caller-key")
	req.Header.Set(reqid.Header, "call-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	want := seen{"/v1/sandboxes/sb-1/agent/files", "path=%2Ftmp%2Fx", "Bearer edge-token", "call-1", "data"}
	if s := <-got; s != want {
		t.Errorf("the edge saw %+v, want %+v", s, want)
	}
	if resp.StatusCode != http.StatusAccepted || string(body) != "{\"stdout\":\"a\"}\n{\"exit\":{}}\n" {
		t.Errorf("answer %d %q", resp.StatusCode, body)
	}
	if resp.Header.Get(reqid.Header) != "call-1" {
		t.Errorf("answer's request id %q, want call-1", resp.Header.Get(reqid.Header))
	}
}

// TestProxyFlushesOnlyStreams: an agent's answer of known length (a
// buffered exec's result) is copied without a flush, so the caller gets
// it in one write with its header; one of unknown length (an NDJSON
// stream) is flushed as it comes.
func TestProxyFlushesOnlyStreams(t *testing.T) {
	const result = `{"exit_code":0,"stdout":"ok\n"}` + "\n"
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("stream") != "" {
			w.Header().Set("Content-Type", "application/x-ndjson")
			fmt.Fprintln(w, `{"stdout":"a"}`)
			http.NewResponseController(w).Flush()
			fmt.Fprintln(w, `{"exit":{}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(result)))
		io.WriteString(w, result)
	}))
	defer agent.Close()
	c, err := edge.NewClient(agent.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		query      string
		wantFlush  bool
		wantLength bool
	}{{"", false, true}, {"stream=1", true, false}} {
		req := httptest.NewRequest(http.MethodPost, "/v1/sandboxes/sb-1/exec?"+tc.query, strings.NewReader(`{"cmd":["true"]}`))
		rec := httptest.NewRecorder()
		c.ProxyAgent(rec, req, "sb-1", "/exec")
		if rec.Code != http.StatusOK {
			t.Fatalf("%q: status %d %s", tc.query, rec.Code, rec.Body)
		}
		if rec.Flushed != tc.wantFlush {
			t.Errorf("%q: flushed %v, want %v", tc.query, rec.Flushed, tc.wantFlush)
		}
		if got := rec.Header().Get("Content-Length") != ""; got != tc.wantLength {
			t.Errorf("%q: Content-Length %q passed on: %v, want %v", tc.query, rec.Header().Get("Content-Length"), got, tc.wantLength)
		}
		if !tc.wantFlush && rec.Body.String() != result {
			t.Errorf("%q: body %q", tc.query, rec.Body)
		}
	}
}
