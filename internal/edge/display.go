package edge

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"

	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/httpapi"
)

// display is the screen backend of a sandbox.
func (e *Edge) display(id string) (backend.Display, error) {
	sb, err := e.get(id)
	if err != nil {
		return nil, err
	}
	if d, ok := sb.backend.(backend.Display); ok && sb.backend.Name() == api.BackendFullVM {
		return d, nil
	}
	// A container's (or a microVM's) screen is its own X server's, if a
	// layer runs one: the agent serves it.
	return agentDisplay{sb.agent}, nil
}

// agentDisplay is the screen of a sandbox whose agent serves it (X11 in
// a container or a microVM): screen and input through X11, VNC through the
// agent's GET /vnc to the layer's x11vnc.
type agentDisplay struct{ c *agent.Client }

func (a agentDisplay) Screenshot(ctx context.Context, _ string) ([]byte, api.Display, error) {
	return a.c.Screenshot(ctx)
}

func (a agentDisplay) Input(ctx context.Context, _ string, actions []api.InputAction) (api.Display, error) {
	return a.c.Input(ctx, actions)
}

func (a agentDisplay) Size(ctx context.Context) (api.Display, error) { return a.c.Display(ctx) }

func (a agentDisplay) DialVNC(ctx context.Context, _ string) (net.Conn, error) {
	return a.c.DialVNC(ctx)
}

// Screenshot returns a sandbox's screen as PNG.
func (e *Edge) Screenshot(ctx context.Context, id string) ([]byte, api.Display, error) {
	d, err := e.display(id)
	if err != nil {
		return nil, api.Display{}, err
	}
	return d.Screenshot(ctx, id)
}

// Input performs input actions on a sandbox's screen.
func (e *Edge) Input(ctx context.Context, id string, actions []api.InputAction) (api.Display, error) {
	d, err := e.display(id)
	if err != nil {
		return api.Display{}, err
	}
	return d.Input(ctx, id, actions)
}

// displaySize is the size of a sandbox's screen: asked of the agent in a
// container, from a screenshot otherwise, at most once per displayTTL.
func (e *Edge) displaySize(ctx context.Context, id string) (api.Display, error) {
	sb, err := e.get(id)
	if err != nil {
		return api.Display{}, err
	}
	return sb.screen.get(ctx, func(ctx context.Context) (api.Display, error) {
		d, err := e.display(id)
		if err != nil {
			return api.Display{}, err
		}
		if a, ok := d.(agentDisplay); ok {
			return a.Size(ctx)
		}
		_, size, err := d.Screenshot(ctx, id)
		return size, err
	})
}

// displayRoutes serves the screen API of the edge: the control plane
// proxies its own routes of the same paths here.
func (e *Edge) displayRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/sandboxes/{id}/screen", func(w http.ResponseWriter, r *http.Request) {
		png, d, err := e.Screenshot(r.Context(), r.PathValue("id"))
		if err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "image/png")
		w.Header().Set("Content-Length", strconv.Itoa(len(png)))
		w.Header().Set("X-Display-Width", strconv.Itoa(d.Width))
		w.Header().Set("X-Display-Height", strconv.Itoa(d.Height))
		w.Write(png)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/input", func(w http.ResponseWriter, r *http.Request) {
		var req api.InputRequest
		if err := httpapi.DecodeJSON(r, &req); err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		d, err := e.Input(r.Context(), r.PathValue("id"), req.Actions)
		if err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, api.InputResult{Done: len(req.Actions), Display: d})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/vnc", e.serveVNC)
	mux.HandleFunc("GET /v1/sandboxes/{id}/display", func(w http.ResponseWriter, r *http.Request) {
		d, err := e.displaySize(r.Context(), r.PathValue("id"))
		if err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, d)
	})
}

// serveVNC bridges a WebSocket (binary messages) to the sandbox's VNC
// server: RFB, as noVNC and other WebSocket VNC clients speak it.
func (e *Edge) serveVNC(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	d, err := e.display(id)
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	conn, err := d.DialVNC(r.Context(), id)
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	defer conn.Close()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols: []string{"binary"}, InsecureSkipVerify: true, // the control plane checked the caller
	})
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	defer nc.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(nc, conn); done <- struct{}{} }()
	go func() { io.Copy(conn, nc); done <- struct{}{} }()
	<-done
}
