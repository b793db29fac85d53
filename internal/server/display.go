package server

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
)

// toEdgeDisplay passes the screen API (GET …/screen, POST …/input, the
// …/vnc WebSocket) on to the sandbox's node, which checks the input and
// answers; a sandbox without a screen is 400 there.
func (s *Server) toEdgeDisplay(w http.ResponseWriter, r *http.Request) error {
	sb, n, err := s.liveSandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	defer s.begin(r.Context(), sb)()
	path := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/'):]
	n.client.ProxySandbox(w, r, sb.API.ID, path)
	return nil
}

// withDisplay adds the screen's size to a running fullvm sandbox's view,
// or a container's or microVM's whose layers run an X server, as its node sees it now;
// the field is left out if there is none or the node cannot say.
func (s *Server) withDisplay(ctx context.Context, v api.Sandbox) api.Sandbox {
	if (v.Backend != api.BackendFullVM && v.Backend != api.BackendContainer && v.Backend != api.BackendMicroVM) || v.State != api.StateRunning {
		return v
	}
	n, err := s.nodes.get(v.Node)
	if err != nil {
		return v
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if d, err := n.client.Display(ctx, v.ID); err == nil {
		v.Display = &d
	}
	return v
}
