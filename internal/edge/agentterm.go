package edge

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
)

// AgentTerminal opens the terminal WebSocket of a sandbox's agent
// (GET /terminal with q: cmd, env, rows, cols): binary frames carry the
// pseudo-terminal's bytes both ways. ctx bounds the connection's whole
// life, not only the handshake. The client-compatibility surfaces use it
// for long-lived shells (SWE-ReX sessions).
func (c *Client) AgentTerminal(ctx context.Context, id string, q url.Values) (*websocket.Conn, error) {
	u := c.base + "/v1/sandboxes/" + url.PathEscape(id) + "/agent/terminal"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	h := http.Header{}
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPClient: c.hc, HTTPHeader: h, CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 && resp.Body != nil {
			defer resp.Body.Close()
			return nil, httpapi.ReadError(resp)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("agent terminal: %w", ctx.Err())
		}
		return nil, fmt.Errorf("agent terminal: %w: %w", err, errdefs.ErrUnavailable)
	}
	return conn, nil
}
