package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/screen/x11"
)

// VNCSocket is where a sandbox's VNC server of its X screen listens: a
// unix socket, so it needs no network (a sandbox may have none) and takes
// no TCP port of the sandbox's own. The desktop toolkit's autostart
// script runs x11vnc on it (examples/build_desktop_toolkit.sh).
const VNCSocket = "/tmp/.dsec-vnc/vnc.sock"

// vncPrograms are where a layer puts the VNC server: one of them there
// means the server is coming (it starts after the X server), none means
// the sandbox has no VNC server at all.
var vncPrograms = []string{"/usr/bin/x11vnc", "/usr/local/bin/x11vnc", "/bin/x11vnc"}

// vncWait bounds how long GET /vnc waits for an installed VNC server to
// listen (after a start or a reset, it comes up after the X server).
const vncWait = 15 * time.Second

// dialVNC connects to the sandbox's VNC server. A sandbox without an X
// server or without a VNC server is ErrInvalid; an installed server that
// does not listen within vncWait is ErrUnavailable.
func dialVNC(ctx context.Context) (net.Conn, error) {
	if _, err := x11.Find(x11.SocketDir); err != nil {
		return nil, errdefs.Invalid("this sandbox has no screen: %v; a container gets one from a layer that starts an X server (the desktop toolkit)", err)
	}
	ctx, cancel := context.WithTimeout(ctx, vncWait)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", VNCSocket)
		if err == nil {
			return c, nil
		}
		if !installed(vncPrograms) {
			return nil, errdefs.Invalid("this sandbox's screen has no VNC server: add x11vnc to its desktop layer (examples/build_desktop_toolkit.sh does when the host has it), or run a VNC server on %s", VNCSocket)
		}
		if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) && ctx.Err() == nil {
			return nil, fmt.Errorf("connect to the sandbox's VNC server: %v: %w", err, errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the sandbox's VNC server (x11vnc) does not listen on %s: %v: %w", VNCSocket, err, errdefs.ErrUnavailable)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// installed reports whether one of paths is an executable file.
func installed(paths []string) bool {
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return true
		}
	}
	return false
}

// handleVNC connects a WebSocket to the sandbox's VNC server: binary
// frames carry RFB both ways. A sandbox without one is refused before the
// upgrade (400), with what to add.
func (s *Server) handleVNC(w http.ResponseWriter, r *http.Request) {
	vnc, err := dialVNC(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer vnc.Close()
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		s.writeError(w, r, errdefs.Invalid("VNC is a WebSocket: send Upgrade: websocket"))
		return
	}
	bridgeWebSocket(w, r, vnc)
}
