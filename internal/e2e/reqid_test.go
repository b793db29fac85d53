package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
)

// TestRequestIDFollowsACreate creates a sandbox with a chosen X-Request-Id
// and follows it through the logs: the answer returns it, and the server's
// line for the call, the edge's lines for its create and the agent's line
// for the file rules the create hands it all carry it.
func TestRequestIDFollowsACreate(t *testing.T) {
	s := startServer(t, "--debug")
	const rid = "e2e-trace-0001"
	body, _ := json.Marshal(api.CreateSandboxRequest{
		Layers:    &api.LayerRefs{Base: "base:minimal"},
		Resources: api.Resources{MemoryMB: 128},
		Phase:     "work",
		Phases:    map[string]api.Phase{"work": {Files: &api.FileRules{Deny: []string{"/secret"}}}},
	})
	req, _ := http.NewRequestWithContext(ctxT(t), "POST", s.URL+"/v1/sandboxes", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.Key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", rid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb api.Sandbox
	if err := json.NewDecoder(resp.Body).Decode(&sb); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %s %v", resp.Status, err)
	}
	t.Cleanup(func() { s.Client.DeleteSandbox(ctxT(t), sb.ID) })
	if got := resp.Header.Get("X-Request-Id"); got != rid {
		t.Fatalf("answer's X-Request-Id = %q, want %q", got, rid)
	}

	// An invalid id is replaced, and the new one returned.
	bad, _ := http.NewRequestWithContext(ctxT(t), "GET", s.URL+"/v1/sandboxes/"+sb.ID, nil)
	bad.Header.Set("Authorization", "Bearer "+s.Key)
	bad.Header.Set("X-Request-Id", "no spaces allowed")
	if r2, err := http.DefaultClient.Do(bad); err != nil {
		t.Fatal(err)
	} else {
		r2.Body.Close()
		if got := r2.Header.Get("X-Request-Id"); got == "" || strings.Contains(got, " ") {
			t.Fatalf("invalid id answered with %q", got)
		}
	}

	tagged := "request=" + rid
	want := []struct{ who, logs, line string }{
		// The server's access line, the edge's access line (it has the
		// node attribute), the edge's create, the container backend's.
		{"server", s.Logs(), `msg=request method=POST route="POST /v1/sandboxes"`},
		{"edge", s.Logs(), `msg=request node=test-node method=POST path=/v1/sandboxes`},
		{"edge create", s.Logs(), `msg="created sandbox" node=test-node sandbox=` + sb.ID},
		{"backend", s.Logs(), `msg=created backend=container sandbox=` + sb.ID},
	}
	// The container backend keeps the agent's log in the sandbox's dir,
	// under the local edge's data dir.
	agentLog, err := os.ReadFile(filepath.Join(s.DataDir, "edge", "container", "sandboxes", sb.ID, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, struct{ who, logs, line string }{"agent", string(agentLog), `msg=policy`})
	for _, w := range want {
		found := false
		for _, l := range strings.Split(w.logs, "\n") {
			if strings.Contains(l, w.line) {
				found = true
				if !strings.Contains(l, tagged) {
					t.Errorf("%s's line lacks %s: %s", w.who, tagged, l)
				}
			}
		}
		if !found {
			t.Errorf("no %s line %q in:\n%s", w.who, w.line, w.logs)
		}
	}
}
