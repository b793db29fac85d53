package client

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/api"
)

// PortPath is the API path that proxies HTTP (and WebSockets) to port of
// a sandbox; path is under the port ("/" for its root).
func PortPath(id string, port int, path string) string {
	if path == "" || path[0] != '/' {
		path = "/" + path
	}
	return "/v1/sandboxes/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port) + path
}

// PortURL makes a signed URL of a sandbox's port that works without a key
// (in a browser) until it expires; ttl 0 is the server's default (1 h).
func (c *Client) PortURL(ctx context.Context, id string, port int, path string, ttl time.Duration) (*api.PortURL, error) {
	var out api.PortURL
	req := api.PortURLRequest{TTLSeconds: int64(ttl / time.Second), Path: path}
	if err := c.do(ctx, http.MethodPost, PortPath(id, port, "/url"), nil, &req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// TerminalURL makes a signed ws:// URL of a sandbox's terminal that
// opens without a key for one minute (what a browser needs: it cannot set
// a WebSocket's headers). Add cmd, rows, cols… to its query.
func (c *Client) TerminalURL(ctx context.Context, id string) (*api.SignedURL, error) {
	return c.signedURL(ctx, id, "terminal")
}

// VNCURL makes a signed ws:// URL of a sandbox's VNC WebSocket that opens
// without a key for one minute.
func (c *Client) VNCURL(ctx context.Context, id string) (*api.SignedURL, error) {
	return c.signedURL(ctx, id, "vnc")
}

func (c *Client) signedURL(ctx context.Context, id, route string) (*api.SignedURL, error) {
	var out api.SignedURL
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/"+route+"/url", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DialPort opens a raw TCP connection to a port of a sandbox, carried
// over a WebSocket (GET /v1/sandboxes/{id}/tcp/{port}). Nothing listening
// there is a not_found error.
func (c *Client) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	conn, err := c.dialWS(ctx, "/v1/sandboxes/"+url.PathEscape(id)+"/tcp/"+strconv.Itoa(port), nil)
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(-1)
	return websocket.NetConn(context.Background(), conn, websocket.MessageBinary), nil
}
