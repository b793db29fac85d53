package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/reqid"
)

// agentHost names the agent in request URLs. It is a placeholder: the
// dial function decides where requests go.
const agentHost = "dsec-agent"

// Client is the edge's side of the agent API. Errors the agent answers
// with come back in their errdefs class.
type Client struct {
	tr     *http.Transport
	inline *inlineTransport  // execs; the rest go to tr
	rt     http.RoundTripper // inline, sending the request id (package reqid)
	hc     *http.Client
}

// NewClient returns a client whose connections come from dial (a unix
// socket, a vsock). Connections are kept alive between requests.
func NewClient(dial func(ctx context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	inline := &inlineTransport{dial: dial, next: tr}
	rt := reqid.Transport(inline)
	return &Client{tr: tr, inline: inline, rt: rt, hc: &http.Client{Transport: rt}}
}

// Transport is the client's round tripper, for proxying arbitrary agent
// paths; any URL host is sent to the agent.
func (c *Client) Transport() http.RoundTripper { return c.rt }

// Close drops idle connections.
func (c *Client) Close() {
	c.tr.CloseIdleConnections()
	c.inline.closeIdle()
}

// Do sends req to the agent; a URL without a host (a bare path) is fine.
// Like http.Client.Do it leaves the status to the caller.
func (c *Client) Do(req *http.Request) (*http.Response, error) {
	if req.URL.Host == "" {
		req = req.Clone(req.Context())
		req.URL.Scheme, req.URL.Host = "http", agentHost
	}
	return c.hc.Do(req)
}

// Health asks the agent whether it is up.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	if err := c.call(ctx, http.MethodGet, "/healthz", nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// Exec runs a command and returns its result; for a background command,
// the result holds its Process.
func (c *Client) Exec(ctx context.Context, req *api.ExecRequest) (*api.ExecResult, error) {
	var res api.ExecResult
	if err := c.call(ctx, http.MethodPost, "/exec", req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecStream runs a command, calling fn with each stdout and stderr event
// as it comes, and returns the exit. If fn fails, the request is dropped —
// which kills the command — and its error returned.
func (c *Client) ExecStream(ctx context.Context, req *api.ExecRequest, fn func(api.ExecEvent) error) (*api.ExecResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := c.send(ctx, http.MethodPost, "/exec", req, ndjson)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != ndjson {
		var res api.ExecResult // a background exec answers at once
		if err := dec.Decode(&res); err != nil {
			return nil, readError(ctx, err)
		}
		return &res, nil
	}
	for {
		var ev api.ExecEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // the stream ended without an exit
			}
			return nil, readError(ctx, err)
		}
		switch {
		case ev.Exit != nil:
			return ev.Exit, nil
		case ev.Error != nil:
			return nil, errdefs.FromAPI(ev.Error)
		}
		if err := fn(ev); err != nil {
			return nil, err
		}
	}
}

// call sends a JSON request and decodes a JSON answer into out.
func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.send(ctx, method, path, in, "application/json")
	if err != nil {
		return err
	}
	if err := httpapi.ReadJSON(resp.Body, out); err != nil {
		return readError(ctx, err)
	}
	return nil
}

// send sends a request and turns a failure status into the agent's error.
func (c *Client) send(ctx context.Context, method, path string, in any, accept string) (*http.Response, error) {
	body, err := httpapi.JSONBody(in)
	if err != nil {
		return nil, fmt.Errorf("agent %s %s: encode request: %w", method, path, err)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+agentHost+path, body)
	if err != nil {
		return nil, fmt.Errorf("agent %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", accept)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, readError(ctx, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, ResponseError(resp)
	}
	return resp, nil
}

// ResponseError turns an agent's failure response into an error of its
// class, whether or not it carried an error body.
func ResponseError(resp *http.Response) error {
	return errdefs.FromAPI(httpapi.APIError(resp, func(status, body string) string {
		return fmt.Sprintf("agent answered %s: %s", status, body)
	}))
}

// readError classes a failure to talk to the agent: the caller's deadline
// or cancellation, else the agent is unavailable.
func readError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("agent: %w", ctx.Err())
	}
	return fmt.Errorf("agent: %w: %w", errdefs.ErrUnavailable, err)
}

// SetPolicy replaces the rules commands started from now on run under.
func (c *Client) SetPolicy(ctx context.Context, p *Policy) error {
	var got Policy
	return c.call(ctx, http.MethodPut, "/policy", p, &got)
}

// Processes lists the agent's background processes.
func (c *Client) Processes(ctx context.Context) ([]api.Process, error) {
	var l api.ProcessList
	if err := c.call(ctx, http.MethodGet, "/procs", nil, &l); err != nil {
		return nil, err
	}
	return l.Processes, nil
}

// Display asks the size of the sandbox's X screen (ErrInvalid: none).
func (c *Client) Display(ctx context.Context) (api.Display, error) {
	var d api.Display
	return d, c.call(ctx, http.MethodGet, "/display", nil, &d)
}

// Screenshot returns the sandbox's X screen as PNG, and its size.
func (c *Client) Screenshot(ctx context.Context) ([]byte, api.Display, error) {
	resp, err := c.send(ctx, http.MethodGet, "/screen", nil, "image/png")
	if err != nil {
		return nil, api.Display{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, api.Display{}, readError(ctx, err)
	}
	var d api.Display
	d.Width, _ = strconv.Atoi(resp.Header.Get(HeaderDisplayWidth))
	d.Height, _ = strconv.Atoi(resp.Header.Get(HeaderDisplayHeight))
	return b, d, nil
}

// Input performs actions on the sandbox's X screen.
func (c *Client) Input(ctx context.Context, actions []api.InputAction) (api.Display, error) {
	var res api.InputResult
	err := c.call(ctx, http.MethodPost, "/input", &api.InputRequest{Actions: actions}, &res)
	return res.Display, err
}

// DialVNC connects to the sandbox's VNC server through the agent's GET
// /vnc WebSocket: the connection carries RFB. ctx bounds the handshake;
// the connection lasts until closed. A sandbox without an X server or
// without a VNC server is ErrInvalid.
func (c *Client) DialVNC(ctx context.Context) (net.Conn, error) {
	ws, resp, err := websocket.Dial(ctx, "ws://"+agentHost+"/vnc", &websocket.DialOptions{
		HTTPClient: c.hc, CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			return nil, ResponseError(resp)
		}
		return nil, readError(ctx, err)
	}
	ws.SetReadLimit(-1) // RFB messages are a stream: frames of any size
	return websocket.NetConn(context.Background(), ws, websocket.MessageBinary), nil
}
