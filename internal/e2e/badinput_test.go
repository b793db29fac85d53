package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestBadInput sends what careless or hostile clients send. Every answer
// must be a 4xx with {"error": {"code", "message"}}, never a 500.
func TestBadInput(t *testing.T) {
	s := startServer(t, "--max-file-bytes", "1048576")
	sb := newSandbox(t, s.Client, nil)
	dead := newSandbox(t, s.Client, nil)
	if err := s.Client.DeleteSandbox(ctxT(t), dead.ID); err != nil {
		t.Fatal(err)
	}
	admin := "Bearer " + s.Key
	sbURL := "/v1/sandboxes/" + sb.ID

	for _, tc := range []struct {
		name, method, path, auth, body string
		status                         int
		code                           string
	}{
		{"no key", "GET", "/v1/sandboxes", "", "", 401, api.CodeUnauthenticated},
		{"wrong key", "GET", "/v1/sandboxes", "Bearer dsec_nope_nope", "", 401, api.CodeUnauthenticated},
		{"garbage key", "GET", "/v1/sandboxes", "Bearer !!!", "", 401, api.CodeUnauthenticated},
		{"malformed JSON", "POST", "/v1/sandboxes", admin, `{"layers": `, 400, api.CodeInvalid},
		{"empty body", "POST", "/v1/sandboxes", admin, ``, 400, api.CodeInvalid},
		{"wrong type", "POST", "/v1/sandboxes", admin, `{"layers": {"base": 5}}`, 400, api.CodeInvalid},
		{"wrong type resources", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "base:minimal"}, "resources": {"cpu": "lots"}}`, 400, api.CodeInvalid},
		{"unknown field", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "base:minimal"}, "colour": "red"}`, 400, api.CodeInvalid},
		{"trailing data", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "base:minimal"}} {}`, 400, api.CodeInvalid},
		{"no base", "POST", "/v1/sandboxes", admin, `{"layers": {}}`, 400, api.CodeInvalid},
		{"unknown layer", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "nope:1"}}`, 404, api.CodeNotFound},
		{"bad layer ref", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "UPPER CASE"}}`, 400, api.CodeInvalid},
		{"bad digest", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "sha256:xyz"}}`, 400, api.CodeInvalid},
		{"wrong layer kind", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "base:minimal", "workspace": "base:minimal"}}`, 400, api.CodeInvalid},
		{"unknown backend", "POST", "/v1/sandboxes", admin, `{"backend": "mainframe", "layers": {"base": "base:minimal"}}`, 400, api.CodeInvalid},
		{"negative memory", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "base:minimal"}, "resources": {"memory_mb": -1}}`, 400, api.CodeInvalid},
		{"bad network", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "base:minimal"}, "network": "everything"}`, 400, api.CodeInvalid},
		{"ttl overflow", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "base:minimal"}, "ttl_seconds": 10000000000}`, 400, api.CodeInvalid},
		{"network unknown field", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "base:minimal"}, "network": {"mode": "none", "x": 1}}`, 400, api.CodeInvalid},
		{"resume a running sandbox", "POST", sbURL + "/resume", admin, "", 409, api.CodeFailedPrecondition},
		{"bad boolean", "GET", "/v1/sandboxes?all=maybe", admin, "", 400, api.CodeInvalid},
		{"huge memory", "POST", "/v1/sandboxes", admin, `{"layers": {"base": "base:minimal"}, "resources": {"memory_mb": 99999999}}`, 429, api.CodeResourceExhausted},
		{"missing sandbox", "GET", "/v1/sandboxes/sb-nope", admin, "", 404, api.CodeNotFound},
		{"exec on deleted", "POST", "/v1/sandboxes/" + dead.ID + "/exec", admin, `{"shell": "true"}`, 404, api.CodeNotFound},
		{"exec neither cmd nor shell", "POST", sbURL + "/exec", admin, `{}`, 400, api.CodeInvalid},
		{"exec both cmd and shell", "POST", sbURL + "/exec", admin, `{"cmd": ["true"], "shell": "true"}`, 400, api.CodeInvalid},
		{"exec wrong type", "POST", sbURL + "/exec", admin, `{"cmd": "true"}`, 400, api.CodeInvalid},
		{"exec malformed", "POST", sbURL + "/exec", admin, `{"cmd": [`, 400, api.CodeInvalid},
		{"relative path", "GET", sbURL + "/files?path=etc/passwd", admin, "", 400, api.CodeInvalid},
		{"dotdot path", "GET", sbURL + "/files?path=/../../etc/passwd", admin, "", 400, api.CodeInvalid},
		{"no path", "GET", sbURL + "/files", admin, "", 400, api.CodeInvalid},
		{"read a directory", "GET", sbURL + "/files?path=/etc", admin, "", 400, api.CodeInvalid},
		{"missing file", "GET", sbURL + "/files?path=/nope", admin, "", 404, api.CodeNotFound},
		{"oversize file", "PUT", sbURL + "/files?path=/big", admin, strings.Repeat("x", 1<<20+1), 413, api.CodeTooLarge},
		{"remove root", "DELETE", sbURL + "/files?path=/", admin, "", 400, api.CodeInvalid},
		{"unknown process", "GET", sbURL + "/processes/p-999", admin, "", 404, api.CodeNotFound},
		{"layer without kind", "POST", "/v1/layers?name=x:1", admin, "data", 400, api.CodeInvalid},
		{"layer bad name", "POST", "/v1/layers?kind=base&name=../x", admin, "data", 400, api.CodeInvalid},
		{"layer not a tar", "POST", "/v1/layers?kind=base&name=x:1", admin, strings.Repeat("not a tar ", 100), 400, api.CodeInvalid},
		{"layer empty", "POST", "/v1/layers?kind=base&name=x:1", admin, "", 400, api.CodeInvalid},
		{"screen of a container", "GET", sbURL + "/screen", admin, "", 400, api.CodeInvalid},
		{"input to a container", "POST", sbURL + "/input", admin, `{"actions": [{"type": "click", "x": 1, "y": 1}]}`, 400, api.CodeInvalid},
		{"input malformed", "POST", sbURL + "/input", admin, `{"actions": 5}`, 400, api.CodeInvalid},
		{"vnc of a container", "GET", sbURL + "/vnc", admin, "", 400, api.CodeInvalid},
		{"vm layer not a disk", "POST", "/v1/layers?kind=vm&name=x:1", admin, strings.Repeat("not a disk ", 500), 400, api.CodeInvalid},
		{"fullvm on a base layer", "POST", "/v1/sandboxes", admin, `{"backend": "fullvm", "layers": {"base": "base:minimal"}}`, 400, api.CodeInvalid},
		{"no route", "GET", "/v1/nothing", admin, "", 404, api.CodeNotFound},
		{"bad tenant name", "POST", "/v1/tenants", admin, `{"name": "No Spaces"}`, 400, api.CodeInvalid},
		{"key for missing tenant", "POST", "/v1/tenants/t-nope/keys", admin, `{}`, 404, api.CodeNotFound},
		{"bad page token", "GET", "/v1/sandboxes?page_token=@@@", admin, "", 400, api.CodeInvalid},
		{"bad limit", "GET", "/v1/sandboxes?limit=-4", admin, "", 400, api.CodeInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, s.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			var er api.ErrorResponse
			if err := json.Unmarshal(body, &er); err != nil || er.Error == nil {
				t.Fatalf("status %d, body not an error object: %q", resp.StatusCode, body)
			}
			if resp.StatusCode != tc.status || er.Error.Code != tc.code || er.Error.Message == "" {
				t.Fatalf("got %d %s %q; want %d %s", resp.StatusCode, er.Error.Code, er.Error.Message, tc.status, tc.code)
			}
		})
	}
	sh(t, s.Client, sb.ID, "true") // the sandbox took all that and still works
}

// TestFailedCreateLeavesNothing: when a create fails half-way (here: a
// layer's metadata chunk corrupted in the store, so the node refuses it),
// no directory, mount, container or cgroup of the sandbox is left.
func TestFailedCreateLeavesNothing(t *testing.T) {
	s := startServer(t)
	ctx := ctxT(t)
	l, err := s.Client.CreateLayer(ctx, api.KindWorkspace, "broken:1", makeTar(t, tarFile{name: "a", body: "a"}), false)
	if err != nil {
		t.Fatal(err)
	}
	var m layer.Manifest
	raw, err := os.ReadFile(filepath.Join(s.DataDir, "store", layer.ManifestKey(l.Digest)))
	if err != nil || json.Unmarshal(raw, &m) != nil {
		t.Fatalf("read manifest: %v", err)
	}
	chunk := filepath.Join(s.DataDir, "store", layer.ChunkKey(m.Meta.Chunks[0].Digest))
	os.Chmod(chunk, 0o644)
	if err := os.WriteFile(chunk, bytes.Repeat([]byte{0}, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = s.Client.CreateSandbox(ctx, &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal", Workspace: "broken:1"}})
	if err == nil {
		t.Fatal("create on a corrupted layer succeeded")
	}
	if client.Code(err) == "" {
		t.Fatalf("not an API error: %v", err)
	}
	testutil.RequireNoSandboxLeft(t, s)
	list, _ := s.Client.ListSandboxes(ctx, client.ListOptions{})
	if len(list.Sandboxes) != 0 {
		t.Fatalf("failed create still listed: %+v", list.Sandboxes)
	}
}

// TestEarlyErrorClosesConnection: an upload refused before its body was
// read (over the file limit) tells the client to close the connection,
// which the server does; the client's next request then goes on a new
// connection instead of into the closed one.
func TestEarlyErrorClosesConnection(t *testing.T) {
	s := startServer(t, "--max-file-bytes", "1048576")
	sb := newSandbox(t, s.Client, nil)
	c := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer c.CloseIdleConnections()
	for i := range 5 {
		req, _ := http.NewRequest(http.MethodPut, s.URL+"/v1/sandboxes/"+sb.ID+"/files?path=/big", strings.NewReader(strings.Repeat("x", 2<<20)))
		req.Header.Set("Authorization", "Bearer "+s.Key)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
			t.Fatalf("round %d: status %d, Connection: close %v; want 413 and close", i, resp.StatusCode, resp.Close)
		}
		req, _ = http.NewRequest(http.MethodDelete, s.URL+"/v1/sandboxes/"+sb.ID+"/files?path=/nothing-here", nil)
		req.Header.Set("Authorization", "Bearer "+s.Key)
		resp, err = c.Do(req)
		if err != nil {
			t.Fatalf("round %d: the request after the refused upload: %v", i, err)
		}
		resp.Body.Close()
	}
}
