package swerex

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

type fakeBackend struct{ box *fakeBox }

type tenantKey struct{}

func (f fakeBackend) Authenticate(ctx context.Context, key string) (context.Context, error) {
	if !strings.HasPrefix(key, "dsec_") {
		return nil, fmt.Errorf("bad key: %w", errdefs.ErrUnauthenticated)
	}
	return context.WithValue(ctx, tenantKey{}, key), nil
}

func (f fakeBackend) Sandbox(ctx context.Context, id string) (Box, error) {
	if id != "sb1" || ctx.Value(tenantKey{}) != "dsec_owner" {
		return nil, errdefs.NotFound("sandbox %s not found", id)
	}
	return f.box, nil
}

type fakeBox struct{ execs atomic.Int64 }

func (b *fakeBox) Exec(_ context.Context, req *api.ExecRequest) (*api.ExecResult, error) {
	b.execs.Add(1)
	return &api.ExecResult{Stdout: strings.Join(req.Cmd, " ") + "\n"}, nil
}
func (b *fakeBox) WriteFile(context.Context, string, []byte) error { return nil }
func (b *fakeBox) ReadFile(_ context.Context, p string) ([]byte, error) {
	return nil, errdefs.NotFound("%s: no such file", p)
}
func (b *fakeBox) Terminal(context.Context, []string, map[string]string) (io.ReadWriteCloser, error) {
	return nil, fmt.Errorf("no terminals here: %w", errdefs.ErrUnavailable)
}

func TestHandlerErrorsAndReplay(t *testing.T) {
	box := &fakeBox{}
	srv := httptest.NewServer(http.StripPrefix("/swerex", New(fakeBackend{box}, Config{})))
	defer srv.Close()
	post := func(path, key, reqID, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		if reqID != "" {
			req.Header.Set("X-Request-ID", reqID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatalf("%s: %d, not JSON: %v", path, resp.StatusCode, err)
		}
		return resp.StatusCode, m
	}
	exec := `{"command":["echo","hi"],"timeout":null,"shell":false,"check":false,"error_msg":"","env":null,"cwd":null,"merge_output_streams":false}`
	for _, tc := range []struct {
		name, path, key, body string
		status                int
		class                 string
	}{
		{"no key", "/swerex/sb1/execute", "", exec, 403, ""},
		{"bad key", "/swerex/sb1/execute", "nope", exec, 401, ""},
		{"other tenant", "/swerex/sb1/execute", "dsec_other", exec, 404, ""},
		{"unknown sandbox", "/swerex/sb2/execute", "dsec_owner", exec, 404, ""},
		{"unknown endpoint", "/swerex/sb1/nope", "dsec_owner", exec, 404, ""},
		{"not json", "/swerex/sb1/execute", "dsec_owner", "{", 422, ""},
		{"command of a wrong type", "/swerex/sb1/execute", "dsec_owner", `{"command":5}`, 422, ""},
		{"no command", "/swerex/sb1/execute", "dsec_owner", `{}`, 422, ""},
		{"no action_type", "/swerex/sb1/run_in_session", "dsec_owner", `{"command":"ls"}`, 422, ""},
		{"no session", "/swerex/sb1/run_in_session", "dsec_owner", `{"command":"ls","action_type":"bash"}`, 511, excNoSession},
		{"no file", "/swerex/sb1/read_file", "dsec_owner", `{"path":"/x"}`, 511, excNotFound},
		{"no terminal", "/swerex/sb1/create_session", "dsec_owner", `{}`, 503, ""},
		{"executes", "/swerex/sb1/execute", "dsec_owner", exec, 200, ""},
	} {
		status, m := post(tc.path, tc.key, "", tc.body)
		if status != tc.status {
			t.Errorf("%s: %d %v, want %d", tc.name, status, m, tc.status)
			continue
		}
		switch {
		case tc.class != "":
			if ex, _ := m["swerexception"].(map[string]any); ex == nil || ex["class_path"] != tc.class {
				t.Errorf("%s: %v, want a %s", tc.name, m, tc.class)
			}
		case status != 200 && m["detail"] == nil:
			t.Errorf("%s: %v has no detail", tc.name, m)
		}
	}

	before := box.execs.Load()
	_, first := post("/swerex/sb1/execute", "dsec_owner", "req-1", exec)
	_, again := post("/swerex/sb1/execute", "dsec_owner", "req-1", exec)
	if n := box.execs.Load() - before; n != 1 || first["stdout"] != "echo hi\n" || again["stdout"] != first["stdout"] {
		t.Errorf("a retry with the same X-Request-ID ran %d times: %v then %v", n, first, again)
	}
	if status, _ := post("/swerex/sb1/execute", "dsec_other", "req-1", exec); status != 404 {
		t.Errorf("another tenant's retry of the owner's request id: %d, want 404", status)
	}
}

func TestPythonRendering(t *testing.T) {
	for in, want := range map[string]string{"ls": "'ls'", "it's": `"it's"`, `a'b"c`: `'a\'b"c'`, "a\nb\\": `'a\nb\\'`} {
		if got := pyRepr(in); got != want {
			t.Errorf("pyRepr(%q) = %s, want %s", in, got, want)
		}
	}
	for in, want := range map[float64]string{25: "25.0", 0.2: "0.2", 1.5: "1.5"} {
		if got := pyFloat(in); got != want {
			t.Errorf("pyFloat(%v) = %s, want %s", in, got, want)
		}
	}
	if got := stripControl([]byte("\x1b[?2004hout\r\nx\x1b[0m\r\n")); got != "out\nx\n" {
		t.Errorf("stripControl: %q", got)
	}
	for in, want := range map[string]string{"../../etc/passwd": "etc/passwd", "/abs/./x": "abs/x", "a/b/": "a/b"} {
		if got := zipName(in); got != want {
			t.Errorf("zipName(%q) = %q, want %q", in, got, want)
		}
	}
	if wrap("# c\n\n") != "" || wrap("ls\npwd") != "{ ls\npwd\n}" {
		t.Errorf("wrap: %q %q", wrap("# c\n\n"), wrap("ls\npwd"))
	}
}
