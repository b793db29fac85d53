package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/compat/swerex"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// SwerexPrefix is where SWE-ReX's remote-runtime API is served, one
// sandbox per path: /swerex/{id}/{endpoint}.
const SwerexPrefix = "/swerex"

// swerexEndpoints are the endpoints of swerex-remote, by method.
var swerexEndpoints = []string{"GET is_alive", "POST create_session", "POST run_in_session", "POST close_session",
	"POST execute", "POST read_file", "POST write_file", "POST upload", "POST close"}

// swerexRoutes mounts SWE-ReX's API.
func (s *Server) swerexRoutes(mux *routeMux) {
	h := swerex.New(swerexBackend{s}, swerex.Config{Logger: s.log})
	strip := http.StripPrefix(SwerexPrefix, h)
	for _, e := range swerexEndpoints {
		method, name, _ := strings.Cut(e, " ")
		mux.Handle(method+" "+SwerexPrefix+"/{id}/"+name, s.instrument(method+" /swerex/"+name, strip.ServeHTTP))
	}
}

// swerexBackend is the control plane as the SWE-ReX surface sees it.
type swerexBackend struct{ s *Server }

func (b swerexBackend) Authenticate(ctx context.Context, key string) (context.Context, error) {
	return compatBackend(b).Authenticate(ctx, key)
}

// Sandbox finds a running sandbox of the caller's tenant (another
// tenant's is not found, as on /v1).
func (b swerexBackend) Sandbox(ctx context.Context, id string) (swerex.Box, error) {
	sb, n, err := b.s.liveSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	return &swerexBox{s: b.s, sb: sb, n: n}, nil
}

type swerexBox struct {
	s  *Server
	sb store.Sandbox
	n  *node
}

func (x *swerexBox) id() string { return x.sb.API.ID }

func (x *swerexBox) Exec(ctx context.Context, req *api.ExecRequest) (*api.ExecResult, error) {
	defer x.s.begin(ctx, x.sb)()
	// The exec's own timeout ends the command; this only guards against
	// a node that never answers.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(req.TimeoutMs)*time.Millisecond+30*time.Second)
	defer cancel()
	return x.n.client.Exec(ctx, x.id(), req)
}

func (x *swerexBox) WriteFile(ctx context.Context, path string, data []byte) error {
	defer x.s.begin(ctx, x.sb)()
	resp, err := x.n.client.AgentDo(ctx, x.id(), http.MethodPut, "/files", url.Values{"path": {path}}, strings.NewReader(string(data)))
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

func (x *swerexBox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	defer x.s.begin(ctx, x.sb)()
	resp, err := x.n.client.AgentDo(ctx, x.id(), http.MethodGet, "/files", url.Values{"path": {path}}, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == "application/json" {
		return nil, errdefs.Invalid("%s is a directory", path)
	}
	return io.ReadAll(resp.Body)
}

// Terminal opens the agent's terminal. It outlives the request that
// opens it: it is one of the sandbox's live connections, ended when the
// sandbox is destroyed or the session closed.
func (x *swerexBox) Terminal(ctx context.Context, argv []string, env map[string]string) (io.ReadWriteCloser, error) {
	q := url.Values{"cmd": argv, "rows": {"50"}, "cols": {"1000"}}
	for k, v := range env {
		q.Add("env", k+"="+v)
	}
	live, done := x.s.conns.add(context.WithoutCancel(ctx), x.id())
	// The handshake is bounded; the connection is not.
	dialCtx, cancel := context.WithCancel(live)
	timer := time.AfterFunc(spawnDialTimeout, cancel)
	conn, err := x.n.client.AgentTerminal(dialCtx, x.id(), q)
	if !timer.Stop() && err == nil {
		conn.CloseNow()
		err = fmt.Errorf("terminal handshake: %w", context.DeadlineExceeded)
	}
	if err != nil {
		cancel()
		done()
		return nil, err
	}
	conn.SetReadLimit(1 << 20)
	return &terminalConn{ReadWriteCloser: websocket.NetConn(live, conn, websocket.MessageBinary), stop: func() {
		conn.CloseNow()
		cancel()
		done()
	}}, nil
}

const spawnDialTimeout = 15 * time.Second

type terminalConn struct {
	io.ReadWriteCloser
	once sync.Once
	stop func()
}

func (t *terminalConn) Close() error {
	err := t.ReadWriteCloser.Close()
	t.once.Do(t.stop)
	return err
}
