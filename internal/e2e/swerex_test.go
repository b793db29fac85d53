package e2e

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/testutil"
)

// rexClient speaks to /swerex/{id} exactly as SWE-ReX's RemoteRuntime
// does (swerex/runtime/remote.py): POST {host}/{endpoint} with the whole
// model_dump() as JSON, X-API-Key and a fresh X-Request-ID; the upload as
// aiohttp's FormData (file, target_path, unzip).
type rexClient struct {
	t         *testing.T
	host, key string
}

type rexAnswer struct {
	status int
	body   map[string]any
	raw    string
}

func (c *rexClient) do(method, endpoint, contentType string, body []byte, hdr map[string]string) rexAnswer {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.host+"/"+endpoint, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.key != "" {
		req.Header.Set("X-API-Key", c.key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, endpoint, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := rexAnswer{status: resp.StatusCode, raw: string(b)}
	if err := json.Unmarshal(b, &a.body); err != nil {
		c.t.Fatalf("%s %s: %d, not a JSON object: %q", method, endpoint, resp.StatusCode, b)
	}
	return a
}

func requestID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// post sends a model as RemoteRuntime._request does.
func (c *rexClient) post(endpoint string, model map[string]any) rexAnswer {
	c.t.Helper()
	b, _ := json.Marshal(model)
	return c.do(http.MethodPost, endpoint, "application/json", b, map[string]string{"X-Request-ID": requestID()})
}

// ok posts and fails the test unless the answer is a 200.
func (c *rexClient) ok(endpoint string, model map[string]any) map[string]any {
	c.t.Helper()
	a := c.post(endpoint, model)
	if a.status != http.StatusOK {
		c.t.Fatalf("%s %v: %d %s", endpoint, model, a.status, a.raw)
	}
	return a.body
}

// exception posts and returns the class path of the 511 exception.
func (c *rexClient) exception(endpoint string, model map[string]any) map[string]any {
	c.t.Helper()
	a := c.post(endpoint, model)
	ex, _ := a.body["swerexception"].(map[string]any)
	if a.status != 511 || ex == nil {
		c.t.Fatalf("%s %v: %d %s, want a 511 swerexception", endpoint, model, a.status, a.raw)
	}
	return ex
}

// bashAction is BashAction().model_dump() with the given fields.
func bashAction(command string, kv ...any) map[string]any {
	m := map[string]any{"command": command, "session": "default", "timeout": 25.0, "is_interactive_command": false,
		"is_interactive_quit": false, "check": "silent", "error_msg": "", "expect": []string{}, "action_type": "bash"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func (c *rexClient) run(command string, kv ...any) map[string]any {
	c.t.Helper()
	return c.ok("run_in_session", bashAction(command, kv...))
}

func (c *rexClient) upload(target string, file []byte, filename string, unzip bool) rexAnswer {
	c.t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", filename)
	fw.Write(file)
	mw.WriteField("target_path", target)
	mw.WriteField("unzip", map[bool]string{true: "true", false: "false"}[unzip])
	mw.Close()
	return c.do(http.MethodPost, "upload", mw.FormDataContentType(), body.Bytes(), nil)
}

// TestSwerex drives a sandbox on base:minimal through /swerex/{id} as
// SWE-agent does through SWE-ReX's RemoteRuntime: the launcher's URL, a
// session with cd, export, exit codes, a timeout and an interrupt, files,
// upload, replay by X-Request-ID, bad input and another tenant.
func TestSwerex(t *testing.T) {
	s := startServer(t)
	out, err := exec.Command(filepath.Join(testutil.Binaries(t), "dsec"), "swerex", "create", "--base", "base:minimal",
		"--url", s.URL, "--key", s.Key).Output()
	if err != nil {
		t.Fatalf("dsec swerex create: %v", err)
	}
	host := strings.TrimSpace(string(out))
	m := regexp.MustCompile(`^` + regexp.QuoteMeta(s.URL) + `/swerex/([a-z0-9-]+)$`).FindStringSubmatch(host)
	if m == nil {
		t.Fatalf("dsec swerex create printed %q, want %s/swerex/ID", host, s.URL)
	}
	t.Cleanup(func() { s.Client.DeleteSandbox(context.Background(), m[1]) })
	c := &rexClient{t: t, host: host, key: s.Key}

	if a := c.do(http.MethodGet, "is_alive", "", nil, nil); a.status != 200 || a.body["is_alive"] != true {
		t.Fatalf("is_alive: %d %s", a.status, a.raw)
	}
	c.ok("create_session", map[string]any{"startup_source": []string{"/root/.bashrc"}, "session": "default",
		"session_type": "bash", "startup_timeout": 10.0})

	testRexSession(t, s, c, m[1])
	if res := sh(t, s.Client, m[1], "ps | grep -c '[s]leep 300' || true"); strings.TrimSpace(res) != "0" {
		t.Errorf("the interrupted sleep still runs: %q", res)
	}

	t.Run("files and upload", func(t *testing.T) {
		c.t = t
		c.ok("write_file", map[string]any{"content": "line 1\nline 2\n", "path": "/work/notes/a.txt"})
		if got := c.ok("read_file", map[string]any{"path": "/work/notes/a.txt", "encoding": nil, "errors": nil}); got["content"] != "line 1\nline 2\n" {
			t.Errorf("read_file: %v", got)
		}
		if got := c.run("cat /work/notes/a.txt | wc -l"); strings.TrimSpace(got["output"].(string)) != "2" {
			t.Errorf("the session does not see the written file: %v", got)
		}
		if ex := c.exception("read_file", map[string]any{"path": "/nope", "encoding": nil, "errors": nil}); ex["class_path"] != "builtins.FileNotFoundError" {
			t.Errorf("read_file of a missing file: %v", ex)
		}
		if a := c.upload("/work/up/one.txt", []byte("uploaded\n"), "one.txt", false); a.status != 200 {
			t.Fatalf("upload a file: %d %s", a.status, a.raw)
		}
		var zb bytes.Buffer
		zw := zip.NewWriter(&zb)
		for name, body := range map[string]string{"repo/main.py": "print('hi')\n", "repo/pkg/mod.py": "X = 1\n"} {
			w, _ := zw.Create(name)
			w.Write([]byte(body))
		}
		zw.Create("repo/empty/")
		zw.Close()
		if a := c.upload("/work/up/tree", zb.Bytes(), "zipped_transfer.zip", true); a.status != 200 {
			t.Fatalf("upload a zipped directory: %d %s", a.status, a.raw)
		}
		got := c.run("cat /work/up/one.txt /work/up/tree/repo/main.py /work/up/tree/repo/pkg/mod.py; test -d /work/up/tree/repo/empty")
		if got["output"] != "uploaded\nprint('hi')\nX = 1\n" || got["exit_code"] != 0.0 {
			t.Errorf("uploaded files: %v", got)
		}
		if a := c.upload("/work/up/bad", []byte("not a zip"), "x.zip", true); a.status != 511 {
			t.Errorf("a bad zip: %d %s, want 511", a.status, a.raw)
		}
	})

	t.Run("execute", func(t *testing.T) {
		c.t = t
		cmd := map[string]any{"command": "echo $GREETING; pwd; echo e >&2; exit 4", "timeout": nil, "shell": true, "check": false,
			"error_msg": "", "env": nil, "cwd": "/work", "merge_output_streams": false}
		got := c.ok("execute", cmd)
		// execute runs outside the session: no GREETING, its own cwd.
		if got["stdout"] != "\n/work\n" || got["stderr"] != "e\n" || got["exit_code"] != 4.0 {
			t.Errorf("execute: %v", got)
		}
		cmd["check"] = true
		if ex := c.exception("execute", cmd); ex["class_path"] != "swerex.exceptions.NonZeroExitCodeError" {
			t.Errorf("execute with check: %v", ex)
		}
		got = c.ok("execute", map[string]any{"command": []string{"sh", "-c", "echo $A; echo x >&2"}, "timeout": 10, "shell": false,
			"check": false, "error_msg": "", "env": map[string]string{"A": "b", "PATH": "/bin"}, "cwd": nil, "merge_output_streams": true})
		if got["stdout"] != "b\nx\n" || got["exit_code"] != 0.0 {
			t.Errorf("execute argv, env, merged: %v", got)
		}
		ex := c.exception("execute", map[string]any{"command": "sleep 30", "timeout": 0.5, "shell": true})
		if ex["class_path"] != "swerex.exceptions.CommandTimeoutError" {
			t.Errorf("execute timeout: %v", ex)
		}
	})

	t.Run("replay by X-Request-ID", func(t *testing.T) {
		c.t = t
		b, _ := json.Marshal(bashAction("echo x >> /tmp/count; wc -l < /tmp/count"))
		hdr := map[string]string{"X-Request-ID": requestID()}
		first := c.do(http.MethodPost, "run_in_session", "application/json", b, hdr)
		again := c.do(http.MethodPost, "run_in_session", "application/json", b, hdr)
		if first.status != 200 || again.raw != first.raw {
			t.Fatalf("retry answered %d %s, first %d %s", again.status, again.raw, first.status, first.raw)
		}
		if got := c.run("wc -l < /tmp/count"); strings.TrimSpace(got["output"].(string)) != "1" {
			t.Errorf("the command ran twice: %v", got)
		}
		// A retry of a failure replays the failure.
		hdr = map[string]string{"X-Request-ID": requestID()}
		b, _ = json.Marshal(bashAction("false", "check", "raise"))
		first = c.do(http.MethodPost, "run_in_session", "application/json", b, hdr)
		again = c.do(http.MethodPost, "run_in_session", "application/json", b, hdr)
		if first.status != 511 || again.raw != first.raw {
			t.Errorf("retry of an exception: %d %s, first %d %s", again.status, again.raw, first.status, first.raw)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		c.t = t
		for _, body := range []string{`not json`, `{"command":"ls"}`, `{"action_type":"nope","command":"ls"}`,
			`{"action_type":"bash"}`, `{"action_type":"bash","command":"ls","check":"maybe"}`, `{"action_type":"bash","command":5}`} {
			a := c.do(http.MethodPost, "run_in_session", "application/json", []byte(body), nil)
			if _, ok := a.body["detail"].([]any); a.status != http.StatusUnprocessableEntity || !ok {
				t.Errorf("%s: %d %s, want 422 with a detail list", body, a.status, a.raw)
			}
		}
		if a := c.do(http.MethodPost, "upload", "application/json", []byte(`{}`), nil); a.status != http.StatusUnprocessableEntity {
			t.Errorf("upload without a form: %d %s", a.status, a.raw)
		}
		if ex := c.exception("run_in_session", bashAction("ls", "session", "nope")); ex["class_path"] != "swerex.exceptions.SessionDoesNotExistError" {
			t.Errorf("unknown session: %v", ex)
		}
		if ex := c.exception("create_session", map[string]any{"session": "default"}); ex["class_path"] != "swerex.exceptions.SessionExistsError" {
			t.Errorf("a session twice: %v", ex)
		}
		nokey := &rexClient{t: t, host: host}
		if a := nokey.post("run_in_session", bashAction("ls")); a.status != http.StatusForbidden || a.body["detail"] == nil {
			t.Errorf("no key: %d %s", a.status, a.raw)
		}
		badkey := &rexClient{t: t, host: host, key: "dsec_nope_nope"}
		if a := badkey.post("run_in_session", bashAction("ls")); a.status != http.StatusUnauthorized || a.body["detail"] != "Invalid API Key" {
			t.Errorf("bad key: %d %s", a.status, a.raw)
		}
		gone := &rexClient{t: t, host: s.URL + "/swerex/nosuchsandbox", key: s.Key}
		if a := gone.post("run_in_session", bashAction("ls")); a.status != http.StatusNotFound || a.body["detail"] == nil {
			t.Errorf("unknown sandbox: %d %s", a.status, a.raw)
		}
	})

	t.Run("other tenant", func(t *testing.T) {
		_, key := swerexTenantKey(t, s, "swerex-other")
		other := &rexClient{t: t, host: host, key: key}
		for _, ep := range []string{"run_in_session", "read_file", "close"} {
			if a := other.post(ep, bashAction("touch /tmp/pwned")); a.status != http.StatusNotFound || a.body["detail"] == nil {
				t.Errorf("%s by another tenant: %d %s, want 404", ep, a.status, a.raw)
			}
		}
		if a := other.do(http.MethodGet, "is_alive", "", nil, nil); a.status != http.StatusNotFound {
			t.Errorf("is_alive by another tenant: %d %s", a.status, a.raw)
		}
		c.t = t
		if got := c.run("test -e /tmp/pwned"); got["exit_code"] != 1.0 {
			t.Errorf("another tenant reached the sandbox: %v", got)
		}
	})

	c.t = t
	if got := c.ok("close_session", map[string]any{"session": "default", "session_type": "bash"}); got["session_type"] != "bash" {
		t.Errorf("close_session: %v", got)
	}
	if ex := c.exception("run_in_session", bashAction("ls")); ex["class_path"] != "swerex.exceptions.SessionDoesNotExistError" {
		t.Errorf("after close_session: %v", ex)
	}
	c.ok("create_session", map[string]any{"session": "second", "startup_timeout": 10.0})
	if a := c.do(http.MethodPost, "close", "", nil, map[string]string{"X-Request-ID": requestID()}); a.status != 200 || a.raw != "{}" {
		t.Errorf("close: %d %s", a.status, a.raw)
	}
	if ex := c.exception("run_in_session", bashAction("ls", "session", "second")); ex["class_path"] != "swerex.exceptions.SessionDoesNotExistError" {
		t.Errorf("after close: %v", ex)
	}
	// The shells are gone from the sandbox.
	eventually(t, 10*time.Second, func() bool {
		return strings.TrimSpace(sh(t, s.Client, m[1], "ps | grep -c ' sh$' || true")) == "0"
	})
}

// testRexSession runs a SWE-agent-style session on c's sandbox (id): cd,
// export, exit codes, checks, a syntax error, a timeout and an interrupt.
// The session "default" exists.
func testRexSession(t *testing.T, s *testutil.Server, c *rexClient, id string) {
	top := c.t
	defer func() { c.t = top }()
	t.Run("cd, export, exit codes", func(t *testing.T) {
		c.t = t
		for _, tc := range []struct {
			cmd, out string
			code     any
		}{
			{"cd /tmp", "", 0.0},
			{"export GREETING=hello", "", 0.0},
			{"pwd; echo $GREETING", "/tmp\nhello\n", 0.0},
			{"false", "", 1.0},
			{"(exit 3)", "", 3.0},
			{"echo out; echo err >&2", "out\nerr\n", 0.0},
			{"echo one\necho two", "one\ntwo\n", 0.0},
			{"cat <<'EOF'\nin a heredoc\nEOF", "in a heredoc\n", 0.0},
			{"# only a comment", "", 0.0},
			// Longer than a terminal's line buffer (4095 bytes).
			{"echo " + strings.Repeat("x", 6000) + " | wc -c", "6001\n", 0.0},
		} {
			got := c.run(tc.cmd)
			if got["output"] != tc.out || got["exit_code"] != tc.code {
				t.Errorf("%q: output %q exit_code %v, want %q %v", tc.cmd, got["output"], got["exit_code"], tc.out, tc.code)
			}
		}
		if got := c.run("false", "check", "ignore"); got["exit_code"] != nil {
			t.Errorf("check=ignore: exit_code %v, want null", got["exit_code"])
		}
		ex := c.exception("run_in_session", bashAction("false", "check", "raise"))
		if ex["class_path"] != "swerex.exceptions.NonZeroExitCodeError" {
			t.Errorf("check=raise on exit 1: %v", ex)
		}
		ex = c.exception("run_in_session", bashAction("echo $(", "check", "raise"))
		info, _ := ex["extra_info"].(map[string]any)
		if ex["class_path"] != "swerex.exceptions.BashIncorrectSyntaxError" || info == nil || info["bash_stderr"] == "" {
			t.Errorf("a syntax error: %v", ex)
		}
	})

	t.Run("timeout and interrupt", func(t *testing.T) {
		c.t = t
		ex := c.exception("run_in_session", bashAction("sleep 300", "timeout", 1.0))
		if ex["class_path"] != "swerex.exceptions.CommandTimeoutError" ||
			!strings.HasPrefix(ex["message"].(string), "timeout after 1.0 seconds while running command") {
			t.Fatalf("timeout: %v", ex)
		}
		got := c.ok("run_in_session", map[string]any{"session": "default", "timeout": 0.2, "n_retry": 3, "expect": []string{},
			"action_type": "bash_interrupt"})
		if got["exit_code"] != 0.0 {
			t.Errorf("interrupt: %v", got)
		}
		// The session survived, with its cwd and environment.
		if got := c.run("echo $GREETING in $(pwd)"); got["output"] != "hello in /tmp\n" || got["exit_code"] != 0.0 {
			t.Errorf("after the interrupt: %v", got)
		}
		if got := c.run("sleep 0.1; echo done"); got["output"] != "done\n" {
			t.Errorf("a command after the interrupt: %v", got)
		}
	})

}

// tenantKey makes a tenant and returns its id and an API key of it.
func swerexTenantKey(t *testing.T, s *testutil.Server, name string) (string, string) {
	t.Helper()
	_, id := tenantClient(t, s, name)
	k, err := s.Client.CreateKey(ctxT(t), id, false)
	if err != nil {
		t.Fatal(err)
	}
	return id, k.Secret
}

// testSwerexBash runs the session on a base with bash (TestCompat's), as
// SWE-agent's images have: bash's own syntax, and the same protocol.
func testSwerexBash(t *testing.T, s *testutil.Server) {
	out, err := exec.Command(filepath.Join(testutil.Binaries(t), "dsec"), "swerex", "create", "--base", compatBase,
		"--url", s.URL, "--key", s.Key).Output()
	if err != nil {
		t.Fatalf("dsec swerex create: %v", err)
	}
	host := strings.TrimSpace(string(out))
	id := host[strings.LastIndexByte(host, '/')+1:]
	t.Cleanup(func() { s.Client.DeleteSandbox(context.Background(), id) })
	c := &rexClient{t: t, host: host, key: s.Key}
	c.ok("create_session", map[string]any{"startup_source": []string{"/root/.bashrc"}, "session": "default",
		"session_type": "bash", "startup_timeout": 10.0})
	if got := c.run("echo $BASH_VERSION"); !strings.HasPrefix(got["output"].(string), "5.") {
		t.Fatalf("the session is not bash: %v", got)
	}
	testRexSession(t, s, c, id)
	if got := c.run("a=(x y z); [[ ${#a[@]} == 3 ]] && echo ${a[1]}"); got["output"] != "y\n" || got["exit_code"] != 0.0 {
		t.Errorf("bash syntax: %v", got)
	}
	c.ok("close", nil)
}
