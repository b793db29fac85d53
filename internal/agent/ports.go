package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// DefaultMaxPortConns bounds the connections open at once to the
// sandbox's ports through the agent: proxied HTTP requests (WebSockets
// included) and TCP tunnels.
const DefaultMaxPortConns = 256

// portConns counts the open port connections of the agent.
type portConns struct {
	n   atomic.Int64
	max int64
}

func (p *portConns) acquire() (release func(), err error) {
	if p.n.Add(1) > p.max {
		p.n.Add(-1)
		return nil, fmt.Errorf("the sandbox has %d port connections open, its limit: %w", p.max, errdefs.ErrResourceExhausted)
	}
	return func() { p.n.Add(-1) }, nil
}

func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, errdefs.Invalid("port %q is not a TCP port (1-65535)", s)
	}
	return n, nil
}

// dialPort connects to a TCP port of the sandbox. The agent runs in the
// sandbox's network namespace, so 127.0.0.1 is the sandbox's own loopback,
// whatever its network mode.
func dialPort(ctx context.Context, port int) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, errdefs.NotFound("nothing listens on port %d in the sandbox", port)
		}
		return nil, fmt.Errorf("connect to port %d in the sandbox: %v: %w", port, err, errdefs.ErrUnavailable)
	}
	return c, nil
}

// handlePortProxy forwards a request to http://127.0.0.1:{port}/{rest} in
// the sandbox, WebSocket upgrades included. The dsec credentials of the
// request (Authorization, the signed-URL cookie) are not passed on.
func (s *Server) handlePortProxy(w http.ResponseWriter, r *http.Request) {
	port, err := parsePort(r.PathValue("port"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	release, err := s.ports.acquire()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	rest := "/" + r.PathValue("rest")
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			pr.Out.URL.Path, pr.Out.URL.RawPath = rest, ""
			pr.Out.Host = pr.Out.URL.Host
			pr.Out.Header.Del("Authorization")
			dropCookie(pr.Out.Header, api.PortTokenCookie)
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dialPort(ctx, port) },
			// A connection per request: nothing idles in the agent after
			// the request, and the connection cap counts what is open.
			DisableKeepAlives:  true,
			DisableCompression: true,
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errdefs.Code(err) == api.CodeInternal {
				err = fmt.Errorf("port %d in the sandbox: %v: %w", port, err, errdefs.ErrUnavailable)
			}
			s.writeError(w, r, err)
		},
	}
	rp.ServeHTTP(w, r)
}

// dropCookie removes one cookie from a request's Cookie headers.
func dropCookie(h http.Header, name string) {
	var keep []string
	for _, line := range h.Values("Cookie") {
		var parts []string
		for part := range strings.SplitSeq(line, ";") {
			if k, _, _ := strings.Cut(strings.TrimSpace(part), "="); k != name {
				parts = append(parts, strings.TrimSpace(part))
			}
		}
		if len(parts) > 0 {
			keep = append(keep, strings.Join(parts, "; "))
		}
	}
	h.Del("Cookie")
	for _, v := range keep {
		h.Add("Cookie", v)
	}
}

// handleTunnel connects a WebSocket to a TCP port of the sandbox: binary
// frames carry the connection's bytes both ways (any protocol). A port
// nobody listens on is refused before the upgrade (404).
func (s *Server) handleTunnel(w http.ResponseWriter, r *http.Request) {
	port, err := parsePort(r.PathValue("port"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		s.writeError(w, r, errdefs.Invalid("a tunnel is a WebSocket: send Upgrade: websocket"))
		return
	}
	release, err := s.ports.acquire()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	tcp, err := dialPort(r.Context(), port)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer tcp.Close()
	bridgeWebSocket(w, r, tcp)
}

// bridgeWebSocket accepts r's WebSocket and copies binary frames to and
// from c until either side ends.
func bridgeWebSocket(w http.ResponseWriter, r *http.Request, c net.Conn) {
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ws := websocket.NetConn(ctx, conn, websocket.MessageBinary)
	defer ws.Close()
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(c, ws)
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite() // the client's end of stream
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(ws, c)
		done <- struct{}{}
	}()
	<-done // either side ended: the bridge is done when one side is
	cancel()
	c.Close()
	ws.Close()
	<-done
}
