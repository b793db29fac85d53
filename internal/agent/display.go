package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/screen"
	"github.com/dsec-project/dsec/internal/screen/x11"
)

// Headers of GET /screen: the screen's size.
const (
	HeaderDisplayWidth  = "X-Display-Width"
	HeaderDisplayHeight = "X-Display-Height"
)

// maxInputBody bounds POST /input (screen.MaxActions actions of
// screen.MaxTextLen text at most, with room for JSON).
const maxInputBody = 4 << 20

// openDisplay connects to the sandbox's X server (the lowest-numbered
// socket in /tmp/.X11-unix). A sandbox without one is ErrInvalid: it has
// no screen.
func openDisplay() (*x11.Display, error) {
	name, err := x11.Find(x11.SocketDir)
	if err != nil {
		return nil, errdefs.Invalid("this sandbox has no screen: %v; a container gets one from a layer that starts an X server (the desktop toolkit)", err)
	}
	d, err := x11.Open(name)
	if errors.Is(err, x11.ErrNoServer) {
		return nil, errdefs.Invalid("this sandbox has no screen: %v", err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	return d, nil
}

// handleDisplay answers the screen's size.
func (s *Server) handleDisplay(w http.ResponseWriter, r *http.Request) {
	d, err := openDisplay()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer d.Close()
	writeJSON(w, http.StatusOK, d.Size())
}

// handleScreen answers the screen as PNG.
func (s *Server) handleScreen(w http.ResponseWriter, r *http.Request) {
	d, err := openDisplay()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer d.Close()
	png, err := d.Screenshot()
	if err != nil {
		s.writeError(w, r, fmt.Errorf("screenshot: %w: %w", errdefs.ErrUnavailable, err))
		return
	}
	size := d.Size()
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Content-Length", strconv.Itoa(len(png)))
	w.Header().Set(HeaderDisplayWidth, strconv.Itoa(size.Width))
	w.Header().Set(HeaderDisplayHeight, strconv.Itoa(size.Height))
	w.Write(png)
}

// handleInput performs input actions in order, one request at a time.
func (s *Server) handleInput(w http.ResponseWriter, r *http.Request) {
	var req api.InputRequest
	if err := decodeJSON(w, r, &req, maxInputBody); err != nil {
		s.writeError(w, r, err)
		return
	}
	d, err := openDisplay()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer d.Close()
	size := d.Size()
	steps, err := screen.Compile(req.Actions, size)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.inputMu.Lock()
	defer s.inputMu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
	defer cancel()
	if err := d.Do(ctx, steps); err != nil {
		s.writeError(w, r, fmt.Errorf("input: %w", err))
		return
	}
	writeJSON(w, http.StatusOK, &api.InputResult{Done: len(req.Actions), Display: size})
}
