package edge

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/reqid"
)

// Client calls an edge's HTTP API. It is what the control plane holds for
// each node.
type Client struct {
	base  string // http://host:port, or http://edge for a unix socket
	token string
	hc    *http.Client
	proxy *httputil.ReverseProxy
	// local is the edge's own handler when it runs in this process (the
	// all-in-one): ProxyAgent hands requests to it directly.
	local http.Handler
}

// NewClient returns a client for the edge at addr: "unix:///path/edge.sock"
// or "http://host:port".
//
// A node that dies without closing its connections (a host gone, a cut
// network) is noticed within seconds: connecting times out after 5 s and
// idle connections are probed by TCP keepalives.
func NewClient(addr, token string) (*Client, error) {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 10 * time.Second}
	tr := &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}
	base := addr
	switch {
	case strings.HasPrefix(addr, "unix://"):
		path := strings.TrimPrefix(addr, "unix://")
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", path)
		}
		base = "http://edge"
	case strings.HasPrefix(addr, "http://"), strings.HasPrefix(addr, "https://"):
	default:
		return nil, errdefs.Invalid("edge address %q: want unix:///path or http://host:port", addr)
	}
	return NewClientTransport(base, token, tr)
}

// NewClientTransport returns a client for the edge at base
// ("http://host:port") whose requests go through rt.
func NewClientTransport(base, token string, rt http.RoundTripper) (*Client, error) {
	tr := reqid.Transport(rt) // the edge and its agents log the API call's id
	c := &Client{base: strings.TrimSuffix(base, "/"), token: token, hc: &http.Client{Transport: tr}}
	c.proxy = &httputil.ReverseProxy{
		Transport:     tr,
		FlushInterval: agentFlush,
		Rewrite:       func(*httputil.ProxyRequest) {}, // set per request in ProxyAgent
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			httpapi.WriteJSON(w, http.StatusServiceUnavailable, api.ErrorResponse{Error: &api.Error{
				Code: api.CodeUnavailable, Message: "node unreachable: " + err.Error(),
			}})
		},
	}
	return c, nil
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	body, err := httpapi.JSONBody(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("edge %s %s: %w: %w", method, path, err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return httpapi.ReadError(resp)
	}
	if err := httpapi.ReadJSON(resp.Body, out); err != nil {
		return fmt.Errorf("edge %s %s: decode: %w", method, path, err)
	}
	return nil
}

// Info describes the node.
func (c *Client) Info(ctx context.Context) (NodeInfo, error) {
	var n NodeInfo
	return n, c.do(ctx, http.MethodGet, "/v1/node", nil, &n)
}

// List reports the node's sandboxes.
func (c *Client) List(ctx context.Context) ([]Status, error) {
	var out []Status
	return out, c.do(ctx, http.MethodGet, "/v1/sandboxes", nil, &out)
}

// Create builds a sandbox on the node.
func (c *Client) Create(ctx context.Context, req CreateRequest) (Status, error) {
	var st Status
	return st, c.do(ctx, http.MethodPost, "/v1/sandboxes", req, &st)
}

// Get reports a sandbox's state.
func (c *Client) Get(ctx context.Context, id string) (Status, error) {
	var st Status
	return st, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+id, nil, &st)
}

// Destroy removes a sandbox; destroying an unknown one succeeds.
func (c *Client) Destroy(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+id, nil, nil)
}

// Reset, Pause and Resume run a lifecycle operation.
func (c *Client) Reset(ctx context.Context, id string) error  { return c.op(ctx, id, "reset") }
func (c *Client) Pause(ctx context.Context, id string) error  { return c.op(ctx, id, "pause") }
func (c *Client) Resume(ctx context.Context, id string) error { return c.op(ctx, id, "resume") }

// Hibernate pauses a sandbox with its memory on the node's disk.
func (c *Client) Hibernate(ctx context.Context, id string) error { return c.op(ctx, id, "hibernate") }

// Fork copies a sandbox with its memory and processes (see Edge.Fork).
func (c *Client) Fork(ctx context.Context, id string, req ForkRequest) (ForkResult, error) {
	var res ForkResult
	return res, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/fork", req, &res)
}

// SetPhase switches a sandbox to another policy phase.
func (c *Client) SetPhase(ctx context.Context, id string, p PhaseRequest) error {
	return c.do(ctx, http.MethodPut, "/v1/sandboxes/"+id+"/phase", p, nil)
}

// Snapshot packs a sandbox's changes into a new layer.
func (c *Client) Snapshot(ctx context.Context, id string, req SnapshotRequest) (SnapshotResult, error) {
	var res SnapshotResult
	return res, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/snapshot", req, &res)
}

func (c *Client) op(ctx context.Context, id, op string) error {
	return c.do(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/"+op, nil, nil)
}

// WithLocal makes ProxyAgent hand its requests to h, the edge's API
// handler running in this process (the all-in-one's own node), instead
// of sending them over the edge's socket. The edge then proxies to the
// agent straight into the caller's ResponseWriter: a warm exec saves an
// HTTP round trip, a proxy and their goroutine handoffs, and streaming,
// full duplex and hijacking work as on the caller's own connection. The
// client's other calls still go over the socket.
func (c *Client) WithLocal(h http.Handler) *Client {
	c.local = h
	return c
}

// ProxyAgent forwards r to the sandbox's agent at path (e.g. "/exec"),
// keeping its query, body and streaming.
func (c *Client) ProxyAgent(w http.ResponseWriter, r *http.Request, id, path string) {
	r2 := r.Clone(r.Context())
	if c.local != nil {
		// What the socket hop would do: the edge sees its own path, its
		// token instead of the caller's credentials, and the call's id.
		r2.URL.Path, r2.URL.RawPath = "/v1/sandboxes/"+id+"/agent"+path, ""
		r2.RequestURI = r2.URL.RequestURI()
		r2.Header.Del("Authorization")
		if c.token != "" {
			r2.Header.Set("Authorization", "Bearer "+c.token)
		}
		if rid := reqid.From(r.Context()); rid != "" {
			r2.Header.Set(reqid.Header, rid)
		}
		c.local.ServeHTTP(w, r2)
		return
	}
	target := c.base + "/v1/sandboxes/" + id + "/agent" + path
	rp := *c.proxy
	rp.Rewrite = func(pr *httputil.ProxyRequest) {
		u := *pr.Out.URL
		t, _ := http.NewRequest(http.MethodGet, target, nil)
		u.Scheme, u.Host, u.Path, u.RawPath = t.URL.Scheme, t.URL.Host, t.URL.Path, ""
		pr.Out.URL = &u
		pr.Out.Host = t.URL.Host
		pr.Out.Header.Del("Authorization")
		if c.token != "" {
			pr.Out.Header.Set("Authorization", "Bearer "+c.token)
		}
	}
	serveDuplex(&rp, w, r2)
}

// Exec runs a command in a sandbox and waits for its result.
func (c *Client) Exec(ctx context.Context, id string, req *api.ExecRequest) (*api.ExecResult, error) {
	var res api.ExecResult
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/agent/exec", req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
