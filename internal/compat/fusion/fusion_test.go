package fusion

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// scripted is a Backend whose one sandbox answers execs from a script: it
// checks the handler's part (steps, statuses, files), not a sandbox's;
// internal/e2e runs the real thing.
type scripted struct {
	results  []*api.ExecResult
	execs    []*api.ExecRequest
	files    map[string]string
	released []bool
	leaseErr error
}

func (s *scripted) Authenticate(ctx context.Context, key string) (context.Context, error) {
	if key != "dsec_good_key" {
		return nil, errors.New("invalid API key")
	}
	return ctx, nil
}

func (s *scripted) Lease(ctx context.Context, layers api.LayerRefs, res api.Resources) (Box, error) {
	if s.leaseErr != nil {
		return nil, s.leaseErr
	}
	return s, nil
}

func (s *scripted) Exec(ctx context.Context, req *api.ExecRequest) (*api.ExecResult, error) {
	s.execs = append(s.execs, req)
	r := s.results[0]
	s.results = s.results[1:]
	return r, nil
}

func (s *scripted) WriteFile(ctx context.Context, path string, data []byte) error {
	s.files[path] = string(data)
	return nil
}

func (s *scripted) ReadFile(ctx context.Context, path string) ([]byte, error) {
	if d, ok := s.files[path]; ok {
		return []byte(d), nil
	}
	return nil, errdefs.NotFound("%s", path)
}

func (s *scripted) Release(clean bool) { s.released = append(s.released, clean) }

func call(t *testing.T, b Backend, path, body string, hdr ...string) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	New(b, Config{}).ServeHTTP(w, req)
	var out map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("%s: %d, not a JSON object: %q", path, w.Code, w.Body)
	}
	return w.Code, out
}

func TestRunCodeSteps(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lang    string
		results []*api.ExecResult
		status  string
		steps   int
		rc      any
	}{
		{"interpreted success", "python", []*api.ExecResult{{Stdout: "5\n"}}, "Success", 1, 0.0},
		{"compile error stops", "cpp", []*api.ExecResult{{ExitCode: 1, Stderr: "error"}}, "Failed", 1, nil},
		{"compile then run", "cpp", []*api.ExecResult{{}, {ExitCode: 3}}, "Failed", 2, 3.0},
		{"signal is negative", "python", []*api.ExecResult{{ExitCode: 137, Signal: "SIGKILL"}}, "Failed", 1, -9.0},
		{"timeout has no code", "python", []*api.ExecResult{{TimedOut: true, ExitCode: -1}}, "Failed", 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &scripted{results: tc.results, files: map[string]string{}}
			code, got := call(t, b, "/dsec_good_key/run_code",
				`{"code":"x","language":"`+tc.lang+`","stdin":"in","files":{"d/a.txt":"eA=="},"fetch_files":["d/a.txt","missing"]}`)
			if code != 200 || got["status"] != tc.status {
				t.Fatalf("%d %v, want status %s", code, got, tc.status)
			}
			if len(b.execs) != tc.steps {
				t.Fatalf("%d execs, want %d", len(b.execs), tc.steps)
			}
			if rr, ok := got["run_result"].(map[string]any); ok && rr["return_code"] != tc.rc {
				t.Errorf("return_code %v, want %v", rr["return_code"], tc.rc)
			}
			if last := b.execs[len(b.execs)-1]; tc.steps == 2 && last.Stdin != "in" || b.execs[0].Cwd != workDir {
				t.Errorf("execs %+v", b.execs)
			}
			if b.files[workDir+"/d/a.txt"] != "x" {
				t.Errorf("files written: %v", b.files)
			}
			if len(b.released) != 1 || !b.released[0] {
				t.Errorf("released %v, want one clean release", b.released)
			}
			if f, _ := got["files"].(map[string]any); tc.steps > 0 && got["run_result"] != nil && f["d/a.txt"] != "eA==" {
				t.Errorf("files %v", got["files"])
			}
		})
	}
}

func TestRunCodeRequests(t *testing.T) {
	good := `{"code":"1","language":"python"}`
	for _, tc := range []struct {
		name, path, body string
		hdr              []string
		want             int
	}{
		{"no key", "/run_code", good, nil, 401},
		{"bad key", "/run_code", good, []string{"X-API-Key", "dsec_bad"}, 401},
		{"bearer", "/run_code", good, []string{"Authorization", "Bearer dsec_good_key"}, 200},
		{"not json", "/dsec_good_key/run_code", "{", nil, 422},
		{"no language", "/dsec_good_key/run_code", `{"code":"1"}`, nil, 422},
		{"unknown language", "/dsec_good_key/run_code", `{"code":"1","language":"cobol"}`, nil, 422},
		{"negative timeout", "/dsec_good_key/run_code", `{"code":"1","language":"python","run_timeout":-2}`, nil, 422},
		{"no runner", "/dsec_good_key/run_code", `{"code":"1","language":"sql"}`, nil, 200},
		{"unknown path", "/dsec_good_key/run_jupyter", good, nil, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &scripted{results: []*api.ExecResult{{}}, files: map[string]string{}}
			code, got := call(t, b, tc.path, tc.body, tc.hdr...)
			if code != tc.want {
				t.Fatalf("%d %v, want %d", code, got, tc.want)
			}
			if code >= 400 && got["detail"] == nil {
				t.Errorf("error without FastAPI's detail: %v", got)
			}
		})
	}
	t.Run("no sandbox in time is 504", func(t *testing.T) {
		b := &scripted{leaseErr: context.DeadlineExceeded}
		if code, got := call(t, b, "/dsec_good_key/run_code", good); code != 504 || got["status"] != "SandboxError" {
			t.Fatalf("%d %v", code, got)
		}
	})
	t.Run("a refused lease is a 4xx", func(t *testing.T) {
		b := &scripted{leaseErr: errdefs.NotFound("layer sandboxfusion:latest")}
		if code, _ := call(t, b, "/dsec_good_key/run_code", good); code != 404 {
			t.Fatalf("%d, want 404", code)
		}
	})
}
