package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/compat/e2b/envdpb/filesystem"
	"github.com/dsec-project/dsec/internal/compat/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/dsec-project/dsec/internal/compat/e2b/envdpb/process"
	"github.com/dsec-project/dsec/internal/compat/e2b/envdpb/process/processconnect"
	"github.com/dsec-project/dsec/internal/errdefs"
)

type tenantKey struct{}

// fakeBackend keeps sandboxes in memory, two tenants ("ka" and "kb" are
// their keys), and an agent that knows one process and a few files.
type fakeBackend struct {
	mu      sync.Mutex
	n       int
	boxes   map[string]*api.Sandbox
	tenant  map[string]string
	files   map[string]string // path → content, in every sandbox
	created []api.CreateSandboxRequest
	signals []string
	execs   []api.ExecRequest
	stdin   []string // writes to p-1's stdin, "<close>" for a close
	noStdin bool     // p-1 was started without stdin_open
}

func newFake() *fakeBackend {
	return &fakeBackend{boxes: map[string]*api.Sandbox{}, tenant: map[string]string{},
		files: map[string]string{"/tmp/a": "hello"}}
}

func (f *fakeBackend) Authenticate(ctx context.Context, key string) (context.Context, error) {
	if key != "ka" && key != "kb" {
		return nil, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	return context.WithValue(ctx, tenantKey{}, key), nil
}

func (f *fakeBackend) Create(ctx context.Context, req *api.CreateSandboxRequest) (*api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Layers.Base == "missing" {
		return nil, errdefs.NotFound("layer missing")
	}
	f.n++
	exp := time.Now().Add(time.Duration(req.TTLSeconds) * time.Second)
	sb := &api.Sandbox{ID: fmt.Sprintf("sb-%03dabc", f.n), State: api.StateRunning, Layers: *req.Layers,
		Labels: req.Labels, Env: req.Env, CreatedAt: time.Now().Add(time.Duration(f.n) * time.Millisecond), ExpiresAt: &exp}
	f.boxes[sb.ID] = sb
	f.tenant[sb.ID] = ctx.Value(tenantKey{}).(string)
	f.created = append(f.created, *req)
	c := *sb
	return &c, nil
}

func (f *fakeBackend) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.boxes[id]
	if !ok || f.tenant[id] != ctx.Value(tenantKey{}) {
		return nil, errdefs.NotFound("sandbox %s", id)
	}
	c := *sb
	return &c, nil
}

func (f *fakeBackend) List(ctx context.Context, labels map[string]string, pageToken string, limit int) ([]api.Sandbox, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.boxes {
		if f.tenant[id] == ctx.Value(tenantKey{}) && f.boxes[id].State != api.StateDeleted {
			ok := true
			for k, v := range labels {
				ok = ok && f.boxes[id].Labels[k] == v
			}
			if ok && id > pageToken {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	next := ""
	if len(ids) > limit {
		ids, next = ids[:limit], ids[limit-1]
	}
	var out []api.Sandbox
	for _, id := range ids {
		out = append(out, *f.boxes[id])
	}
	return out, next, nil
}

func (f *fakeBackend) Delete(ctx context.Context, id string) error {
	if _, err := f.Get(ctx, id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boxes[id].State = api.StateDeleted
	return nil
}

func (f *fakeBackend) Renew(ctx context.Context, id string, ttl time.Duration) (*api.Sandbox, error) {
	if _, err := f.Get(ctx, id); err != nil {
		return nil, err
	}
	f.mu.Lock()
	exp := time.Now().Add(ttl)
	f.boxes[id].ExpiresAt = &exp
	f.mu.Unlock()
	return f.Get(ctx, id)
}

func (f *fakeBackend) setState(ctx context.Context, id, state string) error {
	if _, err := f.Get(ctx, id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boxes[id].State = state
	return nil
}

func (f *fakeBackend) Pause(ctx context.Context, id string) error {
	return f.setState(ctx, id, api.StatePaused)
}
func (f *fakeBackend) Resume(ctx context.Context, id string) error {
	return f.setState(ctx, id, api.StateRunning)
}

// Agent: process p-1 (pid 42, tag "t") prints "hi\n" and "err\n" and
// exits 3; files live in f.files.
func (f *fakeBackend) Agent(ctx context.Context, id, method, path string, q url.Values, body io.Reader) (*http.Response, error) {
	if _, err := f.Get(ctx, id); err != nil {
		return nil, err
	}
	ok := func(s string) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(s))}, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case method == "POST" && path == "/exec":
		var req api.ExecRequest
		json.NewDecoder(body).Decode(&req)
		f.execs = append(f.execs, req)
		if !req.Background {
			return ok(`{"exit_code":0}`)
		}
		return ok(`{"exit_code":0,"process":{"id":"p-1","pid":42,"running":true}}`)
	case method == "GET" && path == "/procs":
		return ok(`{"processes":[{"id":"p-1","pid":42,"running":true,"tag":"t"},{"id":"p-0","pid":7,"running":false}]}`)
	case path == "/procs/p-1/output":
		if q.Get("stream") == "stdout" {
			return ok("hi\n")
		}
		return ok("err\n")
	case path == "/procs/p-1/wait":
		if n := len(f.execs); n > 0 && f.execs[n-1].TimeoutMs == 1500 {
			return ok(`{"id":"p-1","pid":42,"running":false,"result":{"exit_code":137,"signal":"SIGKILL","timed_out":true}}`)
		}
		return ok(`{"id":"p-1","pid":42,"running":false,"result":{"exit_code":3}}`)
	case method == "POST" && (path == "/procs/p-1/stdin" || path == "/procs/p-1/stdin/close"):
		if f.noStdin {
			return nil, fmt.Errorf("p-1 was not started with stdin_open: %w", errdefs.ErrFailedPrecondition)
		}
		if strings.HasSuffix(path, "/close") {
			f.stdin = append(f.stdin, "<close>")
		} else {
			b, _ := io.ReadAll(body)
			f.stdin = append(f.stdin, string(b))
		}
		return ok("")
	case method == "POST" && path == "/procs/p-1/resize":
		b, _ := io.ReadAll(body)
		f.stdin = append(f.stdin, "<resize "+string(b)+">")
		return ok("")
	case path == "/procs/p-1/signal":
		f.signals = append(f.signals, q.Get("signal"))
		return ok(`{}`)
	case method == "GET" && path == "/files" && q.Get("list") == "1":
		dir := q.Get("path")
		fl := api.FileList{Path: dir}
		for p, c := range f.files {
			if strings.TrimSuffix(p[:strings.LastIndex(p, "/")+1], "/") == strings.TrimSuffix(dir, "/") {
				fl.Entries = append(fl.Entries, api.FileInfo{Name: p[strings.LastIndex(p, "/")+1:], Type: "file", Size: int64(len(c)), Mode: 0o644})
			}
		}
		if dir == "/" {
			fl.Entries = append(fl.Entries, api.FileInfo{Name: "tmp", Type: "dir", Mode: 0o1777})
		}
		if len(fl.Entries) == 0 && dir != "/tmp" {
			return nil, errdefs.NotFound("%s", dir)
		}
		b, _ := json.Marshal(fl)
		return ok(string(b))
	case method == "GET" && path == "/files":
		c, found := f.files[q.Get("path")]
		if !found {
			return nil, errdefs.NotFound("%s", q.Get("path"))
		}
		return ok(c)
	case method == "PUT" && path == "/files":
		b, _ := io.ReadAll(body)
		f.files[q.Get("path")] = string(b)
		return ok(`{}`)
	case method == "DELETE" && path == "/files":
		delete(f.files, q.Get("path"))
		return ok("")
	}
	return nil, errdefs.NotFound("agent %s %s", method, path)
}

func setup(t *testing.T) (*fakeBackend, *httptest.Server) {
	f := newFake()
	h := New(f, Config{Templates: map[string]api.LayerRefs{"base": {Base: "debian:12"}}})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	srv := httptest.NewServer(h.Wrap(next))
	t.Cleanup(srv.Close)
	return f, srv
}

func call(t *testing.T, srv *httptest.Server, key, method, path, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func TestIDsAndKeys(t *testing.T) {
	if got := E2BID("sb-2pl7uvg3owuuhclo"); got != "sb2pl7uvg3owuuhclo" {
		t.Fatalf("E2BID = %s", got)
	}
	if got := DsecID("sb2pl7uvg3owuuhclo"); got != "sb-2pl7uvg3owuuhclo" {
		t.Fatalf("DsecID = %s", got)
	}
	k := E2BKey("dsec_abc_def")
	if !strings.HasPrefix(k, "e2b_") || strings.Trim(k[4:], "0123456789abcdef") != "" || DsecKey(k) != "dsec_abc_def" {
		t.Fatalf("E2BKey %s → %s", k, DsecKey(k))
	}
	if DsecKey("dsec_abc_def") != "dsec_abc_def" || DsecKey("e2b_zz") != "e2b_zz" {
		t.Fatal("plain keys pass through")
	}
}

func TestDispatch(t *testing.T) {
	for _, c := range []struct {
		host, path string
		hdr        bool
		want       bool
	}{
		{"127.0.0.1:8080", "/v1/sandboxes", false, false},
		{"127.0.0.1:8080", "/sandboxes", false, true},
		{"127.0.0.1:8080", "/v2/sandboxes/x/connect", false, true},
		{"127.0.0.1:8080", "/health", true, true},
		{"127.0.0.1:8080", "/healthz", false, false},
		{"127.0.0.1:8080", "/files", false, false},
		{"49983-sbabc.dsec.example:8080", "/files", false, true},
		{"api.dsec.example", "/v1/sandboxes", false, false},
	} {
		r := httptest.NewRequest("GET", "http://"+c.host+c.path, nil)
		if c.hdr {
			r.Header.Set("E2b-Sandbox-Id", "sbabc")
		}
		if got := Match(r); got != c.want {
			t.Errorf("Match(%s%s, header %v) = %v", c.host, c.path, c.hdr, got)
		}
	}
	_, srv := setup(t)
	if st, _, _ := call(t, srv, "", "GET", "/v1/sandboxes", ""); st != http.StatusTeapot {
		t.Fatalf("/v1 went to E2B: %d", st)
	}
}

func TestControlPlane(t *testing.T) {
	f, srv := setup(t)
	st, _, b := call(t, srv, "e2b_6b61", "POST", "/sandboxes",
		`{"templateID":"base","timeout":120,"metadata":{"job":"rl"},"envVars":{"A":"1"},"secure":true,"allow_internet_access":true,"extra":1}`)
	if st != 201 {
		t.Fatalf("create: %d %s", st, b)
	}
	var sb sandboxJSON
	json.Unmarshal(b, &sb)
	if sb.SandboxID != "sb001abc" || sb.EnvdVersion != EnvdVersion || sb.EnvdAccessToken != "e2b_6b61" || sb.TemplateID != "base" {
		t.Fatalf("create answer %s", b)
	}
	c := f.created[0]
	if c.Layers.Base != "debian:12" || c.TTLSeconds != 120 || c.Labels["job"] != "rl" || c.Labels[LabelTemplate] != "base" || c.Env["A"] != "1" {
		t.Fatalf("create request %+v", c)
	}
	// v2 without a timeout: 300 s.
	if st, _, b := call(t, srv, "ka", "POST", "/v2/sandboxes", `{"templateID":"debian:13"}`); st != 201 || f.created[1].TTLSeconds != DefaultTimeout || f.created[1].Layers.Base != "debian:13" {
		t.Fatalf("v2 create: %d %s %+v", st, b, f.created[1])
	}
	// Get, list with a metadata filter and paging.
	if st, _, b := call(t, srv, "ka", "GET", "/sandboxes/sb001abc", ""); st != 200 || !strings.Contains(string(b), `"state":"running"`) || !strings.Contains(string(b), `"job":"rl"`) {
		t.Fatalf("get: %d %s", st, b)
	}
	if st, _, b := call(t, srv, "ka", "GET", "/v2/sandboxes?metadata="+url.QueryEscape("job=rl"), ""); st != 200 || strings.Count(string(b), "sandboxID") != 1 {
		t.Fatalf("list by metadata: %d %s", st, b)
	}
	st, hdr, b := call(t, srv, "ka", "GET", "/v2/sandboxes?limit=1", "")
	if st != 200 || strings.Count(string(b), "sandboxID") != 1 || hdr.Get("X-Next-Token") == "" {
		t.Fatalf("page 1: %d %s %v", st, b, hdr)
	}
	if st, hdr, b := call(t, srv, "ka", "GET", "/v2/sandboxes?limit=1&nextToken="+hdr.Get("X-Next-Token"), ""); st != 200 || !strings.Contains(string(b), "sb002abc") || hdr.Get("X-Next-Token") != "" {
		t.Fatalf("page 2: %d %s %v", st, b, hdr)
	}
	// Timeout, pause, connect (resumes: 201), connect again (200).
	if st, _, b := call(t, srv, "ka", "POST", "/sandboxes/sb001abc/timeout", `{"timeout":60}`); st != 204 {
		t.Fatalf("timeout: %d %s", st, b)
	}
	if st, _, b := call(t, srv, "ka", "POST", "/sandboxes/sb001abc/pause", ``); st != 204 {
		t.Fatalf("pause: %d %s", st, b)
	}
	if st, _, _ := call(t, srv, "ka", "POST", "/sandboxes/sb001abc/pause", ``); st != 409 {
		t.Fatalf("pause again: %d", st)
	}
	if st, _, b := call(t, srv, "ka", "POST", "/v2/sandboxes/sb001abc/connect", `{}`); st != 201 {
		t.Fatalf("connect paused: %d %s", st, b)
	}
	if st, _, b := call(t, srv, "ka", "POST", "/sandboxes/sb001abc/connect", `{"timeout":300}`); st != 200 || !strings.Contains(string(b), `"sandboxID":"sb001abc"`) {
		t.Fatalf("connect: %d %s", st, b)
	}
	// Another tenant: 404 in E2B's format.
	for _, p := range []string{"/sandboxes/sb001abc", "/sandboxes/sb001abc/timeout"} {
		method := "GET"
		if strings.HasSuffix(p, "timeout") {
			method = "POST"
		}
		if st, _, b := call(t, srv, "kb", method, p, `{"timeout":1}`); st != 404 || !strings.Contains(string(b), `"code":404`) {
			t.Fatalf("tenant b %s: %d %s", p, st, b)
		}
	}
	// Kill: 204, then 404 {code:404} (the SDK's false).
	if st, _, _ := call(t, srv, "ka", "DELETE", "/sandboxes/sb001abc", ""); st != 204 {
		t.Fatalf("kill: %d", st)
	}
	if st, _, b := call(t, srv, "ka", "DELETE", "/sandboxes/sb001abc", ""); st != 404 || !strings.Contains(string(b), `"code":404`) {
		t.Fatalf("kill again: %d %s", st, b)
	}
}

func TestControlPlaneBadInput(t *testing.T) {
	_, srv := setup(t)
	for _, c := range []struct {
		key, method, path, body string
		want                    int
	}{
		{"", "POST", "/sandboxes", `{"templateID":"base"}`, 401},
		{"nope", "POST", "/sandboxes", `{"templateID":"base"}`, 401},
		{"ka", "POST", "/sandboxes", `{`, 400},
		{"ka", "POST", "/sandboxes", `[]`, 400},
		{"ka", "POST", "/sandboxes", `{}`, 400},
		{"ka", "POST", "/sandboxes", `{"templateID":"base","timeout":99999999}`, 400},
		{"ka", "POST", "/sandboxes", `{"templateID":"missing"}`, 404},
		{"ka", "POST", "/sandboxes", `{"templateID":"base","metadata":{"e2b.dev/template":"x"}}`, 400},
		{"ka", "GET", "/v2/sandboxes?limit=x", "", 400},
		{"ka", "GET", "/v2/sandboxes?metadata=%25zz", "", 400},
		{"ka", "POST", "/sandboxes/x/timeout", `{}`, 400},
		{"ka", "POST", "/sandboxes/x/nothing", `{}`, 404},
		{"ka", "PATCH", "/sandboxes", ``, 405},
		{"ka", "GET", "/sandboxes/a/b/c/d", ``, 404},
	} {
		st, _, b := call(t, srv, c.key, c.method, c.path, c.body)
		var e apiError
		if st != c.want || json.Unmarshal(b, &e) != nil || e.Code != st || e.Message == "" {
			t.Errorf("%s %s %s: %d %s, want %d", c.method, c.path, c.body, st, b, c.want)
		}
	}
}

// envdClient is a Connect client for sandbox id with token.
func envdOpts(id, token string, json bool) []connect.ClientOption {
	opts := []connect.ClientOption{connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("E2b-Sandbox-Id", id)
			req.Header().Set("X-Access-Token", token)
			return next(ctx, req)
		}
	}))}
	if json {
		opts = append(opts, connect.WithProtoJSON())
	}
	return opts
}

func streamHeaders(h http.Header, id, token string) {
	h.Set("E2b-Sandbox-Id", id)
	h.Set("X-Access-Token", token)
	h.Set("Keepalive-Ping-Interval", "1")
}

func TestEnvdProcess(t *testing.T) {
	f, srv := setup(t)
	call(t, srv, "ka", "POST", "/sandboxes", `{"templateID":"base"}`)
	for _, asJSON := range []bool{true, false} {
		pc := processconnect.NewProcessClient(srv.Client(), srv.URL, envdOpts("sb001abc", "ka", asJSON)...)
		req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "x"}}})
		streamHeaders(req.Header(), "sb001abc", "ka")
		st, err := pc.Start(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		var evs []string
		var stdout, stderr string
		var end *process.ProcessEvent_EndEvent
		for st.Receive() {
			ev := st.Msg().GetEvent()
			switch {
			case ev.GetStart() != nil:
				evs = append(evs, fmt.Sprint("start ", ev.GetStart().GetPid()))
			case ev.GetData() != nil:
				stdout += string(ev.GetData().GetStdout())
				stderr += string(ev.GetData().GetStderr())
			case ev.GetEnd() != nil:
				end = ev.GetEnd()
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 || evs[0] != "start 42" || stdout != "hi\n" || stderr != "err\n" || end == nil ||
			end.GetExitCode() != 3 || !end.GetExited() || end.GetError() != "exit status 3" {
			t.Fatalf("json %v: events %v stdout %q stderr %q end %v", asJSON, evs, stdout, stderr, end)
		}
		// List shows the running process with its config.
		lr, err := pc.List(context.Background(), connect.NewRequest(&process.ListRequest{}))
		if err != nil || len(lr.Msg.GetProcesses()) != 1 || lr.Msg.GetProcesses()[0].GetPid() != 42 ||
			lr.Msg.GetProcesses()[0].GetConfig().GetCmd() != "/bin/bash" || lr.Msg.GetProcesses()[0].GetTag() != "t" {
			t.Fatalf("list: %v %v", lr, err)
		}
	}
	pc := processconnect.NewProcessClient(srv.Client(), srv.URL, envdOpts("sb001abc", "ka", true)...)
	sig := func(sel *process.ProcessSelector) error {
		_, err := pc.SendSignal(context.Background(), connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
		return err
	}
	if err := sig(&process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 42}}); err != nil {
		t.Fatal(err)
	}
	if err := sig(&process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "t"}}); err != nil {
		t.Fatal(err)
	}
	if err := sig(&process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 7}}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal an exited process: %v", err)
	}
	if err := sig(nil); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("signal without a selector: %v", err)
	}
	f.mu.Lock()
	if last := f.execs[len(f.execs)-1]; !last.StdinOpen {
		t.Errorf("a Start without stdin:false keeps stdin open (as envd): %+v", last)
	}
	f.mu.Unlock()
	// Connect-Timeout-Ms is the process's lifetime: passed to the exec
	// (not imposed on the request), and a timed-out process ends the
	// stream with deadline_exceeded.
	req0 := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "sleep", Args: []string{"9"}, Cwd: proto.String("/tmp"), Envs: map[string]string{"A": "b"}}, Tag: proto.String("tg")})
	streamHeaders(req0.Header(), "sb001abc", "ka")
	req0.Header().Set("Connect-Timeout-Ms", "1500")
	st0, _ := pc.Start(context.Background(), req0)
	for st0.Receive() {
	}
	if connect.CodeOf(st0.Err()) != connect.CodeDeadlineExceeded {
		t.Fatalf("timed out: %v", st0.Err())
	}
	f.mu.Lock()
	last := f.execs[len(f.execs)-1]
	f.mu.Unlock()
	if last.TimeoutMs != 1500 || last.Cwd != "/tmp" || last.Env["A"] != "b" || last.Tag != "tg" || !last.Background ||
		strings.Join(last.Cmd, " ") != "sleep 9" {
		t.Fatalf("exec request %+v", last)
	}
	// Start without a command.
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{}})
	streamHeaders(req.Header(), "sb001abc", "ka")
	st, _ := pc.Start(context.Background(), req)
	for st.Receive() {
	}
	if connect.CodeOf(st.Err()) != connect.CodeInvalidArgument {
		t.Fatalf("start without cmd: %v", st.Err())
	}
}

func TestEnvdAuthAndGone(t *testing.T) {
	_, srv := setup(t)
	call(t, srv, "ka", "POST", "/sandboxes", `{"templateID":"base"}`)
	hdr := func(id, tok string) []string { return []string{"E2b-Sandbox-Id", id, "X-Access-Token", tok} }
	if st, _, _ := call(t, srv, "", "GET", "/health", "", "E2b-Sandbox-Id", "sb001abc"); st != 204 {
		t.Fatalf("health: %d", st)
	}
	if st, _, b := call(t, srv, "", "GET", "/files?path=/tmp/a", "", "E2b-Sandbox-Id", "sb001abc"); st != 401 || !strings.Contains(string(b), `"code":401`) {
		t.Fatalf("no token: %d %s", st, b)
	}
	for _, h := range [][]string{hdr("sb001abc", "kb"), hdr("sbnothere", "ka")} {
		st, _, b := call(t, srv, "", "GET", "/files?path=/tmp/a", "", h...)
		if st != 502 || !strings.Contains(string(b), `"sandboxId"`) || !strings.Contains(string(b), "The sandbox was not found") {
			t.Fatalf("%v: %d %s", h, st, b)
		}
	}
	if st, _, b := call(t, srv, "", "GET", "/files?path=/tmp/a", "", hdr("sb001abc", "ka")...); st != 200 || string(b) != "hello" {
		t.Fatalf("read: %d %s", st, b)
	}
	// By host: 49983-ID.domain.
	req, _ := http.NewRequest("GET", srv.URL+"/files?path=/tmp/a", nil)
	req.Host = "49983-sb001abc.dsec.test"
	req.Header.Set("X-Access-Token", "ka")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello" {
		t.Fatalf("by host: %d %s", resp.StatusCode, b)
	}
	if st, _, b := call(t, srv, "", "GET", "/envs", "", hdr("sb001abc", "ka")...); st != 200 || string(b) != "{}\n" {
		t.Fatalf("envs: %d %s", st, b)
	}
	if st, _, _ := call(t, srv, "", "GET", "/files", "", hdr("sb001abc", "ka")...); st != 400 {
		t.Fatalf("read without path: %d", st)
	}
	if st, _, b := call(t, srv, "", "GET", "/files?path=/nope", "", hdr("sb001abc", "ka")...); st != 404 || !strings.Contains(string(b), `"code":404`) {
		t.Fatalf("read missing: %d %s", st, b)
	}
	if st, _, _ := call(t, srv, "", "POST", "/process.Process/Start", "x", append(hdr("sb001abc", "ka"), "Connect-Timeout-Ms", "soon")...); st != 400 {
		t.Fatalf("bad Connect-Timeout-Ms: %d", st)
	}
}

func TestEnvdFiles(t *testing.T) {
	f, srv := setup(t)
	call(t, srv, "ka", "POST", "/sandboxes", `{"templateID":"base"}`)
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, p := range []string{"/tmp/x/1.txt", "rel.txt"} {
		w, _ := mw.CreateFormFile("file", p)
		w.Write([]byte("data " + p))
	}
	mw.WriteField("other", "ignored")
	mw.Close()
	st, _, b := call(t, srv, "", "POST", "/files", body.String(), "E2b-Sandbox-Id", "sb001abc", "X-Access-Token", "ka", "Content-Type", mw.FormDataContentType())
	if st != 200 || f.files["/tmp/x/1.txt"] != "data /tmp/x/1.txt" || f.files["/root/rel.txt"] != "data rel.txt" {
		t.Fatalf("multipart: %d %s %v", st, b, f.files)
	}
	var infos []entryInfo
	json.Unmarshal(b, &infos)
	if len(infos) != 2 || infos[0].Path != "/tmp/x/1.txt" || infos[0].Name != "1.txt" || infos[0].Type != "file" {
		t.Fatalf("answer %s", b)
	}
	st, _, b = call(t, srv, "", "POST", "/files?path=/tmp/raw", "raw bytes", "E2b-Sandbox-Id", "sb001abc", "X-Access-Token", "ka", "Content-Type", "application/octet-stream")
	if st != 200 || f.files["/tmp/raw"] != "raw bytes" || !strings.Contains(string(b), `"path":"/tmp/raw"`) {
		t.Fatalf("raw: %d %s", st, b)
	}
	if st, _, _ := call(t, srv, "", "POST", "/files", "x", "E2b-Sandbox-Id", "sb001abc", "X-Access-Token", "ka", "Content-Type", "application/octet-stream"); st != 400 {
		t.Fatalf("raw without path: %d", st)
	}
	if st, _, _ := call(t, srv, "", "POST", "/files", "--x--", "E2b-Sandbox-Id", "sb001abc", "X-Access-Token", "ka", "Content-Type", "multipart/form-data; boundary=x"); st != 400 {
		t.Fatalf("empty multipart: %d", st)
	}
	// The filesystem service over Connect.
	fc := filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, envdOpts("sb001abc", "ka", true)...)
	ctx := context.Background()
	sr, err := fc.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/tmp/a"}))
	if err != nil || sr.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_FILE || sr.Msg.GetEntry().GetSize() != 5 || sr.Msg.GetEntry().GetPath() != "/tmp/a" {
		t.Fatalf("stat: %v %v", sr, err)
	}
	if _, err := fc.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/tmp/none"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat missing: %v", err)
	}
	lr, err := fc.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "/tmp", Depth: 1}))
	if err != nil || len(lr.Msg.GetEntries()) != 2 {
		t.Fatalf("list: %v %v", lr, err)
	}
	if _, err := fc.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "/tmp", Depth: 99})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("list depth 99: %v", err)
	}
	if _, err := fc.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: "/tmp/raw"})); err != nil || f.files["/tmp/raw"] != "" {
		t.Fatalf("remove: %v", err)
	}
	// Watchers: CreateWatcher, a change, GetWatcherEvents, another
	// tenant's sandbox cannot read them, RemoveWatcher.
	cw, err := fc.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/tmp"}))
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.files["/tmp/new"] = "n"
	delete(f.files, "/tmp/a")
	f.mu.Unlock()
	ev, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: cw.Msg.GetWatcherId()}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ev.Msg.GetEvents() {
		got = append(got, e.GetName()+" "+e.GetType().String())
	}
	slices.Sort(got)
	if strings.Join(got, ",") != "a EVENT_TYPE_REMOVE,new EVENT_TYPE_CREATE" {
		t.Fatalf("events %v", got)
	}
	if _, err := fc.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: cw.Msg.GetWatcherId()})); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: cw.Msg.GetWatcherId()})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("removed watcher: %v", err)
	}
}

func TestEndEvent(t *testing.T) {
	e := endEvent(&api.ExecResult{ExitCode: 137, Signal: "SIGKILL"})
	if e.GetExitCode() != -1 || e.GetExited() || e.GetStatus() != "signal: killed" {
		t.Fatalf("%v", e)
	}
	e = endEvent(&api.ExecResult{})
	if e.GetExitCode() != 0 || !e.GetExited() || e.Error != nil || e.GetStatus() != "exit status 0" {
		t.Fatalf("%v", e)
	}
}

func TestConnectError(t *testing.T) {
	for _, c := range []struct {
		err  error
		want connect.Code
	}{
		{errdefs.Invalid("x"), connect.CodeInvalidArgument},
		{errdefs.NotFound("x"), connect.CodeNotFound},
		{fmt.Errorf("x: %w", errdefs.ErrTooLarge), connect.CodeResourceExhausted},
		{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
		{errors.New("boom"), connect.CodeInternal},
	} {
		if got := connect.CodeOf(connectError(c.err)); got != c.want {
			t.Errorf("%v → %v, want %v", c.err, got, c.want)
		}
	}
}

func TestEnvdInput(t *testing.T) {
	f, srv := setup(t)
	call(t, srv, "ka", "POST", "/sandboxes", `{"templateID":"base"}`)
	pc := processconnect.NewProcessClient(srv.Client(), srv.URL, envdOpts("sb001abc", "ka", true)...)
	ctx := context.Background()
	pid42 := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 42}}

	// Start with stdin:true asks the agent to keep stdin open; stdin:false
	// does not, unless on a terminal.
	for _, c := range []struct {
		stdin *bool
		pty   bool
		want  bool
	}{{proto.Bool(true), false, true}, {proto.Bool(false), false, false}, {proto.Bool(false), true, true}} {
		req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "cat"}, Stdin: c.stdin})
		if c.pty {
			req.Msg.Pty = &process.PTY{Size: &process.PTY_Size{Rows: 24, Cols: 80}}
		}
		streamHeaders(req.Header(), "sb001abc", "ka")
		st, err := pc.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for st.Receive() {
		}
		f.mu.Lock()
		last := f.execs[len(f.execs)-1]
		f.mu.Unlock()
		if last.StdinOpen != c.want {
			t.Errorf("stdin %v pty %v: exec stdin_open %v, want %v", c.stdin, c.pty, last.StdinOpen, c.want)
		}
	}

	// SendInput: stdin and pty bytes go to the agent's stdin route.
	for _, in := range []*process.ProcessInput{
		{Input: &process.ProcessInput_Stdin{Stdin: []byte("hello\n")}},
		{Input: &process.ProcessInput_Pty{Pty: []byte("typed")}},
	} {
		if _, err := pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pid42, Input: in})); err != nil {
			t.Fatalf("send input: %v", err)
		}
	}
	// A big input goes in pieces the agent takes.
	big := strings.Repeat("x", 1<<20+10)
	if _, err := pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pid42,
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(big)}}})); err != nil {
		t.Fatalf("send big input: %v", err)
	}
	_, err := pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pid42}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("send no input: %v", err)
	}
	_, err = pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 7}},
		Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("send input to an exited process: %v", err)
	}

	// StreamInput, a client stream (over HTTP/1.1 here).
	cs := pc.StreamInput(ctx)
	cs.RequestHeader().Set("E2b-Sandbox-Id", "sb001abc")
	cs.RequestHeader().Set("X-Access-Token", "ka")
	for _, m := range []*process.StreamInputRequest{
		{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "t"}}}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("a")}}}}},
		{Event: &process.StreamInputRequest_Keepalive{Keepalive: &process.StreamInputRequest_KeepAlive{}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("b")}}}}},
	} {
		if err := cs.Send(m); err != nil {
			t.Fatalf("stream input send: %v", err)
		}
	}
	if _, err := cs.CloseAndReceive(); err != nil {
		t.Fatalf("stream input: %v", err)
	}
	cs = pc.StreamInput(ctx)
	cs.RequestHeader().Set("E2b-Sandbox-Id", "sb001abc")
	cs.RequestHeader().Set("X-Access-Token", "ka")
	_ = cs.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("c")}}}}})
	if _, err := cs.CloseAndReceive(); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("stream input without start: %v", err)
	}

	if _, err := pc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pid42})); err != nil {
		t.Fatalf("close stdin: %v", err)
	}
	if _, err := pc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: pid42,
		Pty: &process.PTY{Size: &process.PTY_Size{Rows: 30, Cols: 100}}})); err != nil {
		t.Fatalf("update: %v", err)
	}
	f.mu.Lock()
	got := f.stdin
	f.noStdin = true
	f.mu.Unlock()
	want := []string{"hello\n", "typed", big[:1<<20], big[1<<20:], "a", "b", "<close>", `<resize {"rows":30,"cols":100}>`}
	if !slices.Equal(got, want) {
		t.Errorf("agent stdin writes: %d %.40q, want %d %.40q", len(got), got, len(want), want)
	}

	// A process started with stdin:false: input is refused, a close is a
	// no-op (as in envd).
	_, err = pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: pid42,
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("send input without stdin: %v", err)
	}
	if _, err := pc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pid42})); err != nil {
		t.Errorf("close stdin without stdin: %v", err)
	}
}
