package edge

import (
	"context"
	"fmt"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// ForkRequest is the body of the edge's POST /v1/sandboxes/{id}/fork: the
// ids of the copies to make on this node.
type ForkRequest struct {
	Copies []string `json:"copies"`
}

// ForkResult is the answer to a fork on the node.
type ForkResult struct {
	Sandboxes []Status `json:"sandboxes"`
	// DurationMs is the time until every copy ran.
	DurationMs int64 `json:"duration_ms"`
}

// Fork copies a sandbox with its memory and processes into new sandboxes
// on this node (backends that are a backend.Forker: microvm). It is all
// or nothing.
func (e *Edge) Fork(ctx context.Context, id string, req ForkRequest) (ForkResult, error) {
	if len(req.Copies) == 0 {
		return ForkResult{}, errdefs.Invalid("fork of %s: no copies", id)
	}
	if err := e.checkDisk(); err != nil {
		return ForkResult{}, err
	}
	start := time.Now()
	var res ForkResult
	err := e.lifecycle(ctx, id, func(sb *sandbox) error {
		f, ok := sb.backend.(backend.Forker)
		if !ok {
			return errdefs.Invalid("sandbox %s: backend %s cannot fork with memory", id, sb.backend.Name())
		}
		// Reserve the ids first, so that no create takes one meanwhile.
		e.mu.Lock()
		for _, c := range req.Copies {
			if _, dup := e.sandboxes[c]; dup {
				e.mu.Unlock()
				return fmt.Errorf("sandbox %s: %w", c, errdefs.ErrAlreadyExists)
			}
		}
		placeholders := map[string]*sandbox{}
		for _, c := range req.Copies {
			spec := sb.spec
			spec.ID = c
			placeholders[c] = e.newSandbox(spec, sb.backend)
			placeholders[c].op.Lock()
			e.sandboxes[c] = placeholders[c]
		}
		e.mu.Unlock()
		defer func() {
			for _, p := range placeholders {
				p.op.Unlock()
			}
		}()
		specs, err := f.Fork(ctx, id, req.Copies)
		if err != nil {
			e.mu.Lock()
			for c, p := range placeholders {
				if e.sandboxes[c] == p {
					delete(e.sandboxes, c)
				}
			}
			e.mu.Unlock()
			return err
		}
		for _, spec := range specs {
			placeholders[spec.ID].spec = spec
			res.Sandboxes = append(res.Sandboxes, Status{ID: spec.ID, Backend: spec.Backend, State: api.StateRunning})
		}
		return nil
	})
	if err != nil {
		return ForkResult{}, err
	}
	res.DurationMs = time.Since(start).Milliseconds()
	e.log.Info("forked with memory", "sandbox", id, "copies", len(req.Copies), "took", time.Since(start))
	return res, nil
}

// Hibernate pauses a sandbox with its memory on the node's disk
// (backends that are a backend.Hibernator: microvm); Resume restores it.
func (e *Edge) Hibernate(ctx context.Context, id string) error {
	return e.lifecycle(ctx, id, func(sb *sandbox) error {
		h, ok := sb.backend.(backend.Hibernator)
		if !ok {
			return errdefs.Invalid("sandbox %s: backend %s cannot hibernate (pause with memory on disk); pause it instead",
				id, sb.backend.Name())
		}
		return h.Hibernate(ctx, id)
	})
}
