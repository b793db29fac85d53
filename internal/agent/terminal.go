package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Defaults of a terminal.
const (
	defaultRows = 24
	defaultCols = 80
	// maxTerminalFrame bounds a frame from the client (keystrokes, a
	// paste).
	maxTerminalFrame = 1 << 20
)

// terminalSpec turns the query of GET /terminal into a command on a
// pseudo-terminal: cmd (repeated: the argv; default a login-less shell),
// cwd, env (repeated KEY=VALUE), rows and cols.
func terminalSpec(q url.Values) (*execSpec, error) {
	req := api.ExecRequest{Cmd: q["cmd"], Cwd: q.Get("cwd"), TTY: &api.TTYSize{Rows: defaultRows, Cols: defaultCols}}
	if len(req.Cmd) == 0 {
		req.Cmd = []string{"/bin/sh"}
		if _, err := os.Stat("/bin/bash"); err == nil {
			req.Cmd = []string{"/bin/bash"}
		}
	}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, errdefs.Invalid("env %q is not KEY=VALUE", kv)
		}
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	for name, p := range map[string]*int{"rows": &req.TTY.Rows, "cols": &req.TTY.Cols} {
		if v := q.Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, errdefs.Invalid("%s %q is not an integer", name, v)
			}
			*p = n
		}
	}
	spec, err := prepare(&req)
	if err != nil {
		return nil, err
	}
	spec.timeout = 0 // a terminal lasts as long as its client
	return spec, nil
}

// handleTerminal runs a command on a pseudo-terminal and connects it to a
// WebSocket: binary frames are keystrokes in and terminal output out,
// JSON text frames resize the terminal or signal its foreground process
// group, and a last "exit" frame carries the command's exit. The terminal
// lives until its command exits or the client goes; then what is left of
// its session is killed.
func (s *Server) handleTerminal(w http.ResponseWriter, r *http.Request) {
	spec, err := terminalSpec(r.URL.Query())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		s.writeError(w, r, errdefs.Invalid("a terminal is a WebSocket: send Upgrade: websocket"))
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		// The control plane authenticated the client; the agent is
		// reached only through it.
		InsecureSkipVerify: true,
		CompressionMode:    websocket.CompressionDisabled,
	})
	if err != nil {
		return // Accept answered
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxTerminalFrame)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	out := &wsWriter{ctx: ctx, conn: conn}
	c, err := s.start(spec, out, nil)
	var se *startError
	switch {
	case errors.As(err, &se):
		res, msg := se.result()
		_, _ = out.Write(msg)
		sendExit(ctx, conn, &res)
		return
	case err != nil:
		conn.Close(websocket.StatusInternalError, truncReason(err.Error()))
		return
	}
	log := logger(r)
	log.InfoContext(ctx, "terminal", "argv0", spec.argv[0], "pid", c.child.pid, "rows", spec.tty.Rows, "cols", spec.tty.Cols)
	// A bad control message ends the terminal with a close reason.
	bad := make(chan error, 1)
	go func() {
		defer cancel()
		for {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				return // the client went, or closed
			}
			if typ == websocket.MessageBinary {
				if _, err := c.io.pty.Write(data); err != nil {
					return
				}
				continue
			}
			if err := s.terminalControl(c, data); err != nil {
				bad <- err
				return
			}
		}
	}()
	c.wait(ctx, 0) // the client gone: killed
	killSession(c.child.pid)
	res := c.result(false)
	log.InfoContext(ctx, "terminal exited", "pid", c.child.pid, "exit_code", res.ExitCode, "signal", res.Signal, "client_gone", ctx.Err() != nil)
	select {
	case err := <-bad:
		conn.Close(websocket.StatusPolicyViolation, truncReason(err.Error()))
	default:
		if ctx.Err() == nil {
			sendExit(ctx, conn, &res)
		}
	}
}

// terminalControl acts on a JSON text frame from the client.
func (s *Server) terminalControl(c *command, data []byte) error {
	var m api.TerminalMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return errdefs.Invalid("text frame is not a JSON message: %v", err)
	}
	switch m.Type {
	case api.TerminalResize:
		return setSize(c.io.pty, m.Rows, m.Cols)
	case api.TerminalSignal:
		sig, ok := parseSignal(m.Signal)
		if !ok {
			return errdefs.Invalid("signal %q is not one of TERM, KILL, INT, HUP, QUIT, USR1, USR2", m.Signal)
		}
		if pg, err := foreground(c.io.pty); err == nil && pg > 0 {
			_ = killGroup(pg, sig)
		} else {
			c.child.signalGroup(sig)
		}
		return nil
	default:
		return errdefs.Invalid("message type %q is not resize or signal", m.Type)
	}
}

func sendExit(ctx context.Context, conn *websocket.Conn, res *api.ExecResult) {
	code := res.ExitCode
	b, _ := json.Marshal(api.TerminalMessage{Type: api.TerminalExit, ExitCode: &code, Signal: res.Signal})
	if conn.Write(ctx, websocket.MessageText, b) == nil {
		conn.Close(websocket.StatusNormalClosure, "exited")
	}
}

// truncReason fits a close reason in a control frame (123 bytes).
func truncReason(s string) string {
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// wsWriter sends what is written to it as binary frames. A slow client
// slows the command; a gone one (ctx ended) discards.
type wsWriter struct {
	ctx  context.Context
	conn *websocket.Conn
}

func (w *wsWriter) Write(p []byte) (int, error) {
	if w.ctx.Err() == nil {
		_ = w.conn.Write(w.ctx, websocket.MessageBinary, p)
	}
	return len(p), nil
}
