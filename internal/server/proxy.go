package server

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/dsec-project/dsec/internal/store"
)

// activeEvery throttles writes of a sandbox's last-active time.
const activeEvery = 30 * time.Second

// exec runs a command in a sandbox: the request goes through to the
// sandbox's agent on its node, and the result (JSON or an NDJSON stream)
// comes back as the agent writes it.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	return s.toAgent(w, r, "/exec")
}

// files reads, writes, lists and removes files through the agent, which
// resolves paths inside the sandbox's own root.
func (s *Server) files(w http.ResponseWriter, r *http.Request) error {
	return s.toAgent(w, r, "/files")
}

// processes reads and signals background commands.
func (s *Server) processes(w http.ResponseWriter, r *http.Request) error {
	path := "/procs"
	if rest := r.PathValue("rest"); rest != "" {
		path += "/" + strings.TrimPrefix(rest, "/")
	}
	return s.toAgent(w, r, path)
}

func (s *Server) toAgent(w http.ResponseWriter, r *http.Request, path string) error {
	sb, n, err := s.liveSandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	s.touch(r.Context(), sb)
	n.client.ProxyAgent(w, r, sb.API.ID, path)
	return nil
}

// touch records that a sandbox was used, at most every activeEvery.
func (s *Server) touch(ctx context.Context, sb store.Sandbox) {
	now := time.Now()
	s.activeMu.Lock()
	last, ok := s.active[sb.API.ID]
	if !ok {
		last = sb.LastActive
	}
	if now.Sub(last) < activeEvery {
		s.activeMu.Unlock()
		return
	}
	s.active[sb.API.ID] = now
	s.activeMu.Unlock()
	if err := s.store.TouchSandbox(context.WithoutCancel(ctx), sb.API.ID, now.UTC()); err != nil {
		s.log.Warn("record activity", "sandbox", sb.API.ID, "err", err)
	}
}
