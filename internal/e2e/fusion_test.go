package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/internal/testutil"
)

// verlBody is the body verl's call_sandbox_api sends, field for field
// (verl/utils/reward_score/sandbox_fusion/utils.py).
func verlBody(code, stdin, language string, timeout, memoryMB int) string {
	b, _ := json.Marshal(map[string]any{
		"compile_timeout": timeout, "run_timeout": timeout, "code": code, "stdin": stdin,
		"memory_limit_MB": memoryMB, "language": language, "files": map[string]string{}, "fetch_files": []string{},
	})
	return string(b)
}

func testFusion(t *testing.T, s *testutil.Server) {
	url := s.URL + "/sandboxfusion/" + s.Key + "/run_code"
	cpp := "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;return 0;}\n"
	for _, tc := range []struct {
		name, body string
		status     string // top-level
		compile    string // compile_result.status, "" for none
		run        string // run_result.status, "" for none
		rc         any    // run (or failed compile) return_code
		stdout     string
		stderr     string // a part of it
	}{
		{"python success", verlBody("a, b = map(int, input().split())\nprint(a + b)", "2 3", "python", 10, 1024),
			"Success", "", "Finished", 0.0, "5\n", ""},
		{"python runtime error", verlBody("print(1/0)", "", "python", 10, 1024),
			"Failed", "", "Finished", 1.0, "", "ZeroDivisionError"},
		{"python timeout", verlBody("while True: pass", "", "python", 1, 1024),
			"Failed", "", "TimeLimitExceeded", nil, "", ""},
		{"python memory limit", verlBody("x = bytearray(400 << 20)\nprint(len(x))", "", "python", 10, 64),
			"Failed", "", "Finished", -9.0, "", ""},
		{"cpp success", verlBody(cpp, "40 2", "cpp", 30, 1024),
			"Success", "Finished", "Finished", 0.0, "42\n", ""},
		{"cpp compile error", verlBody("int main(){ return x; }", "", "cpp", 30, 1024),
			"Failed", "Finished", "", 1.0, "", "not declared"},
		{"cpp runtime error", verlBody("int main(){ int *p = nullptr; return *p; }", "", "cpp", 30, 1024),
			"Failed", "Finished", "Finished", -11.0, "", ""},
		{"cpp timeout", verlBody("int main(){ for(;;){} }", "", "cpp", 2, 1024),
			"Failed", "Finished", "TimeLimitExceeded", nil, "", ""},
		{"bash with files", `{"code":"tr a-z A-Z < in.txt > out.txt; cat out.txt","language":"bash",` +
			`"files":{"in.txt":"aGVsbG8K"},"fetch_files":["out.txt"]}`,
			"Success", "", "Finished", 0.0, "HELLO\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, got := postJSON(t, url, nil, tc.body)
			if code != http.StatusOK || got["status"] != tc.status {
				t.Fatalf("got %d %v, want status %s", code, got, tc.status)
			}
			step := got["run_result"]
			if tc.compile != "" {
				cr, _ := got["compile_result"].(map[string]any)
				if cr == nil || cr["status"] != tc.compile {
					t.Fatalf("compile_result %v, want status %s", got["compile_result"], tc.compile)
				}
				if tc.run == "" {
					step = cr
				}
			} else if got["compile_result"] != nil {
				t.Fatalf("compile_result %v for an interpreted language", got["compile_result"])
			}
			if tc.run == "" {
				if got["run_result"] != nil {
					t.Fatalf("run_result %v after a failed compile", got["run_result"])
				}
			} else if rr, _ := got["run_result"].(map[string]any); rr == nil || rr["status"] != tc.run {
				t.Fatalf("run_result %v, want status %s", got["run_result"], tc.run)
			}
			r := step.(map[string]any)
			if r["return_code"] != tc.rc {
				t.Errorf("return_code %v, want %v (%v)", r["return_code"], tc.rc, r)
			}
			if tc.stdout != "" && r["stdout"] != tc.stdout {
				t.Errorf("stdout %q, want %q", r["stdout"], tc.stdout)
			}
			if s, _ := r["stderr"].(string); !strings.Contains(s, tc.stderr) {
				t.Errorf("stderr %q lacks %q", s, tc.stderr)
			}
			if _, ok := r["execution_time"].(float64); !ok {
				t.Errorf("execution_time %v is not a number", r["execution_time"])
			}
			if tc.name == "bash with files" {
				if f, _ := got["files"].(map[string]any); f["out.txt"] != "SEVMTE8K" {
					t.Errorf("files %v, want out.txt = SEVMTE8K", got["files"])
				}
			}
		})
	}

	t.Run("each call a clean sandbox", func(t *testing.T) {
		for i := range 2 {
			_, got := postJSON(t, url, nil, verlBody(
				"import os\nprint(os.path.exists('/tmp/mark'))\nopen('/tmp/mark','w').write('x')", "", "python", 10, 1024))
			if rr := got["run_result"].(map[string]any); rr["stdout"] != "False\n" {
				t.Fatalf("call %d saw a file of an earlier call: %v", i, rr)
			}
		}
	})

	t.Run("auth", func(t *testing.T) {
		body := verlBody("print(1)", "", "python", 10, 1024)
		for _, tc := range []struct {
			name, url string
			hdr       map[string]string
			want      int
		}{
			{"no key", s.URL + "/sandboxfusion/run_code", nil, 401},
			{"bad key in path", s.URL + "/sandboxfusion/dsec_nope_nope/run_code", nil, 401},
			{"bad bearer", s.URL + "/sandboxfusion/run_code", map[string]string{"Authorization": "Bearer dsec_x_y"}, 401},
			{"bearer", s.URL + "/sandboxfusion/run_code", map[string]string{"Authorization": "Bearer " + s.Key}, 200},
			{"x-api-key", s.URL + "/sandboxfusion/run_code", map[string]string{"X-API-Key": s.Key}, 200},
		} {
			if code, got := postJSON(t, tc.url, tc.hdr, body); code != tc.want || (code != 200 && got["detail"] == nil) {
				t.Errorf("%s: %d %v, want %d with a detail", tc.name, code, got, tc.want)
			}
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, body := range []string{`not json`, `{"language":"python"}`, `{"code":"1","language":"cobol"}`,
			`{"code":"1","language":"python","run_timeout":-1}`, `{"code":"1","language":"python","files":{"":"eA=="}}`,
			`{"code":"1","language":"python","files":{"a":"%%%"}}`} {
			if code, got := postJSON(t, url, nil, body); code != http.StatusUnprocessableEntity || got["detail"] == nil {
				t.Errorf("%s: %d %v, want 422 with a detail", body, code, got)
			}
		}
		code, got := postJSON(t, url, nil, `{"code":"1","language":"sql"}`)
		if code != 200 || got["status"] != "SandboxError" {
			t.Errorf("sql: %d %v, want 200 SandboxError", code, got)
		}
	})

	t.Run("ping", func(t *testing.T) {
		resp, err := http.Get(s.URL + "/sandboxfusion/v1/ping")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != `"pong"` {
			t.Fatalf("ping: %d %q", resp.StatusCode, b)
		}
	})
}
