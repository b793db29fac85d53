package agent

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// Freezer freezes the sandbox's writable file system, so that the host
// can read a consistent copy of it (a microVM's writable disk) while the
// sandbox runs. Freeze flushes every change and blocks writers until Thaw,
// or until timeout has passed: a host that dies mid-snapshot must not
// leave the sandbox frozen.
type Freezer interface {
	Freeze(timeout time.Duration) error
	Thaw() error
}

// FreezeState is the body of the freeze routes' answers.
type FreezeState struct {
	Frozen bool `json:"frozen"`
}

// maxFreeze bounds how long a sandbox may stay frozen.
const maxFreeze = 10 * time.Minute

func (s *Server) handleFreeze(w http.ResponseWriter, r *http.Request) {
	timeout := time.Minute
	if v := r.URL.Query().Get("timeout_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || time.Duration(ms)*time.Millisecond > maxFreeze {
			s.writeError(w, r, errdefs.Invalid("timeout_ms: want 1 to %d", maxFreeze.Milliseconds()))
			return
		}
		timeout = time.Duration(ms) * time.Millisecond
	}
	if err := s.cfg.Freezer.Freeze(timeout); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, &FreezeState{Frozen: true})
}

func (s *Server) handleThaw(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Freezer.Thaw(); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, &FreezeState{Frozen: false})
}

// Freeze asks the agent to freeze the writable file system for at most
// timeout. Agents without a Freezer answer not found.
func (c *Client) Freeze(ctx context.Context, timeout time.Duration) error {
	var st FreezeState
	return c.call(ctx, http.MethodPost, "/fs/freeze?timeout_ms="+strconv.FormatInt(timeout.Milliseconds(), 10), nil, &st)
}

// Thaw ends a Freeze.
func (c *Client) Thaw(ctx context.Context) error {
	var st FreezeState
	return c.call(ctx, http.MethodPost, "/fs/thaw", nil, &st)
}
