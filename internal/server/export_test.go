package server

import (
	"context"

	"github.com/dsec-project/dsec/internal/edge"
)

// Reconcile runs one reconcile of a node, as a heartbeat that (re)connects
// it does.
func Reconcile(s *Server, ctx context.Context, nodeID string, c *edge.Client) error {
	return s.reconcile(ctx, nodeID, c, false)
}
