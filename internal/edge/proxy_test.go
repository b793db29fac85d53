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
