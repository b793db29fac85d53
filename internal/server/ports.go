package server

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
)

// Limits of signed port URLs.
const (
	defaultPortURLTTL = time.Hour
	maxPortURLTTL     = 24 * time.Hour
)

// LoadURLSigningKey reads the secret signed port URLs are made with from
// path, creating it (32 random bytes, mode 0600) if it does not exist.
// Replicas must share one: give them the same file.
func LoadURLSigningKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key := make([]byte, 32)
		rand.Read(key)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			return LoadURLSigningKey(path) // another process made it first
		}
		if err != nil {
			return nil, err
		}
		if _, err := f.WriteString(base64.StdEncoding.EncodeToString(key) + "\n"); err != nil {
			f.Close()
			return nil, err
		}
		return key, f.Close()
	}
	if err != nil {
		return nil, err
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) < 16 {
		return nil, fmt.Errorf("URL signing key %s: want at least 16 bytes, base64", path)
	}
	return key, nil
}

// urlClaims is what a signed URL's token says.
type urlClaims struct {
	Tenant string `json:"t"`
	Exp    int64  `json:"e"` // Unix seconds
}

// routeMAC binds a token to one route ("ports/8080", "terminal", "vnc")
// of one sandbox of one tenant, until exp.
func (s *Server) routeMAC(route, sandbox string, c urlClaims) []byte {
	m := hmac.New(sha256.New, s.urlKey)
	fmt.Fprintf(m, "dsec signed url\x00%s\x00%s\x00%s\x00%d", route, sandbox, c.Tenant, c.Exp)
	return m.Sum(nil)
}

var b64u = base64.RawURLEncoding

// signRoute makes a token for one route of one sandbox of a tenant: what
// signed port URLs and the browser's terminal and VNC URLs carry.
func (s *Server) signRoute(route, sandbox, tenant string, exp time.Time) string {
	c := urlClaims{Tenant: tenant, Exp: exp.Unix()}
	head, _ := json.Marshal(c)
	return b64u.EncodeToString(head) + "." + b64u.EncodeToString(s.routeMAC(route, sandbox, c))
}

// verifyRoute checks a token for that route of that sandbox and returns
// the tenant it speaks for (never an admin).
func (s *Server) verifyRoute(token, route, sandbox string) (principal, error) {
	bad := fmt.Errorf("invalid or expired signed URL token: %w", errdefs.ErrUnauthenticated)
	head, sig, ok := strings.Cut(token, ".")
	if !ok {
		return principal{}, bad
	}
	hb, err1 := b64u.DecodeString(head)
	mac, err2 := b64u.DecodeString(sig)
	var c urlClaims
	if err1 != nil || err2 != nil || json.Unmarshal(hb, &c) != nil || c.Tenant == "" {
		return principal{}, bad
	}
	if !hmac.Equal(mac, s.routeMAC(route, sandbox, c)) || time.Now().Unix() >= c.Exp {
		return principal{}, bad
	}
	return principal{Tenant: c.Tenant}, nil
}

func portRoute(port int) string { return "ports/" + strconv.Itoa(port) }

func portParam(r *http.Request) (int, error) {
	v := r.PathValue("port")
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 65535 {
		return 0, errdefs.Invalid("port %q is not a TCP port (1-65535)", v)
	}
	return n, nil
}

// portURL answers POST /v1/sandboxes/{id}/ports/{port}/url with a signed,
// expiring URL of the port.
func (s *Server) portURL(w http.ResponseWriter, r *http.Request) error {
	port, err := portParam(r)
	if err != nil {
		return err
	}
	var req api.PortURLRequest
	if r.ContentLength != 0 {
		if err := httpapi.DecodeJSON(r, &req); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	}
	ttl := defaultPortURLTTL
	switch {
	case req.TTLSeconds < 0 || time.Duration(req.TTLSeconds)*time.Second > maxPortURLTTL:
		return errdefs.Invalid("ttl_seconds %d is out of range [0, %d]", req.TTLSeconds, int64(maxPortURLTTL/time.Second))
	case req.TTLSeconds > 0:
		ttl = time.Duration(req.TTLSeconds) * time.Second
	}
	path := req.Path
	if path == "" {
		path = "/"
	}
	if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, "?#") {
		return errdefs.Invalid("path %q must start with / and have no query", path)
	}
	sb, err := s.sandboxFor(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	exp := time.Now().Add(ttl).Truncate(time.Second)
	tok := s.signRoute(portRoute(port), sb.API.ID, principalFrom(r.Context()).Tenant, exp)
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	u := fmt.Sprintf("%s://%s/v1/sandboxes/%s/ports/%d%s?token=%s", scheme, r.Host, url.PathEscape(sb.API.ID), port, path, tok)
	httpapi.WriteJSON(w, http.StatusOK, api.PortURL{URL: u, Token: tok, ExpiresAt: exp.UTC()})
	return nil
}

// portProxy serves /v1/sandboxes/{id}/ports/{port}/{path...}: HTTP and
// WebSockets to a TCP port in the sandbox, through the edge and the agent
// (which dials it inside the sandbox's network namespace, so no sandbox
// network is needed). The caller is a key, or a signed URL's token (in
// the query, then in a cookie scoped to the port's path).
func (s *Server) portProxy(w http.ResponseWriter, r *http.Request) {
	if err := s.servePort(w, r); err != nil {
		httpapi.WriteError(w, r, err)
	}
}

func (s *Server) servePort(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	port, err := portParam(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	tok, fromQuery := q.Get("token"), q.Has("token")
	if !fromQuery {
		if c, err := r.Cookie(api.PortTokenCookie); err == nil {
			tok = c.Value
		}
	}
	var p principal
	if tok != "" && r.Header.Get("Authorization") == "" {
		p, err = s.verifyRoute(tok, portRoute(port), id)
	} else {
		p, err = s.auth.authenticate(r)
	}
	if err != nil {
		return err
	}
	r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
	if fromQuery {
		q.Del("token")
		r.URL.RawQuery = q.Encode()
		http.SetCookie(w, &http.Cookie{
			Name: api.PortTokenCookie, Value: tok, Path: fmt.Sprintf("/v1/sandboxes/%s/ports/%d/", id, port),
			HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil,
		})
	}
	return s.toAgentConn(w, r, fmt.Sprintf("/ports/%d/%s", port, r.PathValue("path")))
}

// tunnel serves GET /v1/sandboxes/{id}/tcp/{port}: a WebSocket carrying
// a raw TCP connection to the port (dsec sandbox port-forward).
func (s *Server) tunnel(w http.ResponseWriter, r *http.Request) error {
	port, err := portParam(r)
	if err != nil {
		return err
	}
	return s.toAgentConn(w, r, fmt.Sprintf("/tcp/%d", port))
}

// toAgentConn is toAgent for a connection that may last: it is closed
// when the sandbox is destroyed through this server.
func (s *Server) toAgentConn(w http.ResponseWriter, r *http.Request, path string) error {
	sb, n, err := s.liveSandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	ctx, done := s.conns.add(r.Context(), sb.API.ID)
	defer done()
	defer s.begin(r.Context(), sb)()
	n.client.ProxyAgent(w, r.WithContext(ctx), sb.API.ID, path)
	return nil
}

// liveConns are the long-lived connections to sandboxes (terminals,
// ports, tunnels) this server passes through, by sandbox.
type liveConns struct {
	mu   sync.Mutex
	next int
	m    map[string]map[int]context.CancelFunc
}

func (c *liveConns) add(parent context.Context, sandbox string) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]map[int]context.CancelFunc{}
	}
	c.next++
	k := c.next
	if c.m[sandbox] == nil {
		c.m[sandbox] = map[int]context.CancelFunc{}
	}
	c.m[sandbox][k] = cancel
	c.mu.Unlock()
	return ctx, func() {
		cancel()
		c.mu.Lock()
		delete(c.m[sandbox], k)
		if len(c.m[sandbox]) == 0 {
			delete(c.m, sandbox)
		}
		c.mu.Unlock()
	}
}

// closeAll ends every connection to a sandbox.
func (c *liveConns) closeAll(sandbox string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cancel := range c.m[sandbox] {
		cancel()
	}
}
