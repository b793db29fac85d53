package edge_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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
