package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/api"
)

// TerminalOptions say what a terminal runs.
type TerminalOptions struct {
	Cmd        []string // default: the sandbox's shell
	Cwd        string
	Env        map[string]string
	Rows, Cols int // default 24x80
}

// Terminal is an interactive command on a pseudo-terminal in a sandbox,
// over a WebSocket. Write types into it; Read returns its output and
// io.EOF once the command has exited (then Exit says how).
type Terminal struct {
	conn *websocket.Conn
	ctx  context.Context

	rmu  sync.Mutex
	buf  []byte
	exit *api.TerminalMessage
	rerr error
}

// wsURL is the ws:// (or wss://) URL of an API path.
func (c *Client) wsURL(path string, q url.Values) string {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	if rest, ok := strings.CutPrefix(u, "http"); ok {
		u = "ws" + rest
	}
	return u
}

// dialWS opens a WebSocket to an API path; a refused handshake comes back
// as the server's error.
func (c *Client) dialWS(ctx context.Context, path string, q url.Values) (*websocket.Conn, error) {
	h := http.Header{}
	if c.key != "" {
		h.Set("Authorization", "Bearer "+c.key)
	}
	conn, resp, err := websocket.Dial(ctx, c.wsURL(path, q), &websocket.DialOptions{
		HTTPClient: c.hc, HTTPHeader: h, CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 && resp.Body != nil {
			defer resp.Body.Close()
			return nil, readError(resp)
		}
		return nil, err
	}
	conn.SetReadLimit(1 << 20)
	return conn, nil
}

// Terminal opens a terminal in a sandbox. ctx bounds the handshake only;
// Close ends the terminal.
func (c *Client) Terminal(ctx context.Context, id string, o TerminalOptions) (*Terminal, error) {
	q := url.Values{}
	for _, a := range o.Cmd {
		q.Add("cmd", a)
	}
	if o.Cwd != "" {
		q.Set("cwd", o.Cwd)
	}
	for k, v := range o.Env {
		q.Add("env", k+"="+v)
	}
	if o.Rows != 0 {
		q.Set("rows", strconv.Itoa(o.Rows))
	}
	if o.Cols != 0 {
		q.Set("cols", strconv.Itoa(o.Cols))
	}
	conn, err := c.dialWS(ctx, "/v1/sandboxes/"+url.PathEscape(id)+"/terminal", q)
	if err != nil {
		return nil, err
	}
	return &Terminal{conn: conn, ctx: context.Background()}, nil
}

// Write sends keystrokes (any bytes) to the terminal.
func (t *Terminal) Write(p []byte) (int, error) {
	if err := t.conn.Write(t.ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Read reads the terminal's output. After the command exits it returns
// io.EOF; a terminal closed for another reason returns that reason.
func (t *Terminal) Read(p []byte) (int, error) {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	for len(t.buf) == 0 {
		if t.rerr != nil {
			return 0, t.rerr
		}
		typ, data, err := t.conn.Read(t.ctx)
		switch {
		case err != nil && t.exit != nil:
			t.rerr = io.EOF
		case err != nil:
			t.rerr = terminalError(err)
		case typ == websocket.MessageBinary:
			t.buf = data
		default:
			var m api.TerminalMessage
			if json.Unmarshal(data, &m) == nil && m.Type == api.TerminalExit {
				t.exit = &m
			}
		}
	}
	n := copy(p, t.buf)
	t.buf = t.buf[n:]
	return n, nil
}

// terminalError turns a close frame into an error that says why.
func terminalError(err error) error {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		if ce.Code == websocket.StatusNormalClosure {
			return io.EOF
		}
		code := api.CodeInternal
		if ce.Code == websocket.StatusPolicyViolation {
			code = api.CodeInvalid
		}
		return &api.Error{Code: code, Message: "terminal closed: " + ce.Reason}
	}
	return err
}

// Exit is the command's exit code (and signal name, if a signal ended
// it), once Read has returned io.EOF; ok is false before.
func (t *Terminal) Exit() (code int, signal string, ok bool) {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	if t.exit == nil || t.exit.ExitCode == nil {
		return 0, "", false
	}
	return *t.exit.ExitCode, t.exit.Signal, true
}

// Resize changes the terminal's window size (the command gets SIGWINCH).
func (t *Terminal) Resize(rows, cols int) error {
	return t.control(api.TerminalMessage{Type: api.TerminalResize, Rows: rows, Cols: cols})
}

// Signal sends a signal (TERM, KILL, INT, HUP, QUIT, USR1, USR2) to the
// terminal's foreground process group.
func (t *Terminal) Signal(sig string) error {
	return t.control(api.TerminalMessage{Type: api.TerminalSignal, Signal: sig})
}

func (t *Terminal) control(m api.TerminalMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return t.conn.Write(t.ctx, websocket.MessageText, b)
}

// Close ends the terminal; the command and what it started are killed if
// still running.
func (t *Terminal) Close() error {
	return t.conn.Close(websocket.StatusNormalClosure, "")
}
