package edge

import (
	"context"
	"net/http"

	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/httpapi"
)

// RecycleResult is the body of the edge's POST /v1/sandboxes/{id}/recycle.
type RecycleResult struct {
	Reset bool `json:"reset"`
}

// Recycle brings a sandbox back to a clean state for its next user: as is
// when its backend proves nothing changed, by a reset otherwise.
func (e *Edge) Recycle(ctx context.Context, id string) (bool, error) {
	reset := true
	err := e.lifecycle(ctx, id, func(sb *sandbox) error {
		if r, ok := sb.backend.(backend.Recycler); ok {
			var err error
			reset, err = r.Recycle(ctx, id)
			if reset {
				sb.agent.Close() // connections to the old agent are dead
			}
			return err
		}
		sb.agent.Close()
		return sb.backend.Reset(ctx, id)
	})
	return reset, err
}

func (e *Edge) handleRecycle(w http.ResponseWriter, r *http.Request) {
	reset, err := e.Recycle(r.Context(), r.PathValue("id"))
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, RecycleResult{Reset: reset})
}

// Recycle asks the node to make a sandbox clean for its next user; it
// reports whether that took a reset.
func (c *Client) Recycle(ctx context.Context, id string) (bool, error) {
	var out RecycleResult
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/recycle", nil, &out)
	return out.Reset, err
}
