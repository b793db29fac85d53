package client

import (
	"context"
	"net"
	"net/url"

	"github.com/coder/websocket"
)

// DialVNC connects to a sandbox's VNC server through the API's VNC
// WebSocket: the connection carries RFB (QEMU's server for a fullvm
// sandbox, the desktop toolkit's x11vnc for a container or microVM). ctx
// bounds the handshake; Close ends the connection. A sandbox without a
// screen or without a VNC server is an *api.Error of code invalid.
func (c *Client) DialVNC(ctx context.Context, id string) (net.Conn, error) {
	conn, err := c.dialWS(ctx, "/v1/sandboxes/"+url.PathEscape(id)+"/vnc", nil)
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(-1)
	return websocket.NetConn(context.Background(), conn, websocket.MessageBinary), nil
}
