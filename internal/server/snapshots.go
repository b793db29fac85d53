package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/store"
)

// DefaultMaxSnapshotDepth is how many snapshot layers may stack on a
// sandbox's layers before the next snapshot flattens them into one.
const DefaultMaxSnapshotDepth = 4

// snapshotSandbox is pack_diff: the sandbox's node freezes it, packs its
// changes into a new layer in the shared store and thaws it; the layer is
// recorded as the tenant's, kind snapshot, with the stack it goes on.
func (s *Server) snapshotSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.SnapshotRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil && !errors.Is(err, httpapi.ErrEmptyBody) {
		return err
	}
	sb, err := s.sandboxFor(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if sb, err = s.afterCheckpoint(r.Context(), sb); err != nil {
		return err
	}
	switch sb.API.State {
	case api.StateRunning, api.StatePaused:
	case api.StateDeleted, api.StateFailed:
		return errdefs.NotFound("sandbox %s is %s", sb.API.ID, sb.API.State)
	default:
		return fmt.Errorf("sandbox %s is %s: %w", sb.API.ID, sb.API.State, errdefs.ErrFailedPrecondition)
	}
	name, tag := "snapshot/"+sb.API.ID, strconv.FormatInt(time.Now().UnixNano(), 10)
	if req.Name != "" {
		if name, tag, err = ParseRef(req.Name); err != nil {
			return err
		}
	}
	if strings.HasPrefix(name, checkpointPrefix) {
		return errdefs.Invalid("layer names %s… are kept for trajectory checkpoints", checkpointPrefix)
	}
	n, err := s.nodes.get(sb.API.Node)
	if err != nil {
		return err
	}
	l, err := s.pack(context.WithoutCancel(r.Context()), sb, n, name, tag) // once the sandbox is frozen, see it through
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusCreated, layerAPI(l))
	return nil
}

// pack has the sandbox's node pack its changes into a snapshot layer
// name:tag of its tenant, flattening the snapshots under it when they
// would stack deeper than the limit, and records the layer.
func (s *Server) pack(ctx context.Context, sb store.Sandbox, n *node, name, tag string) (store.Layer, error) {
	l, _, err := s.packAside(ctx, sb, n, name, tag, false)
	return l, err
}

// packAside is pack; with aside the node copies the changes aside while
// the sandbox is frozen and packs them after the thaw. It also returns
// how long the sandbox was frozen.
func (s *Server) packAside(ctx context.Context, sb store.Sandbox, n *node, name, tag string, aside bool) (store.Layer, time.Duration, error) {
	defer s.layerWriter()()
	stack := sb.LayerDigests
	depth := s.snapshotDepth(ctx, sb.Tenant, stack)
	merge := 0
	if depth+1 > s.cfg.MaxSnapshotDepth {
		merge = depth
	}
	res, err := n.client.Snapshot(ctx, sb.API.ID, edge.SnapshotRequest{Merge: merge, Aside: aside})
	if err != nil {
		return store.Layer{}, 0, err
	}
	l := store.Layer{
		Tenant: sb.Tenant, Name: name, Tag: tag, Digest: res.Digest, Kind: api.KindSnapshot, Size: res.Size,
		CreatedAt: time.Now().UTC(), Parents: append([]string(nil), stack[:len(stack)-merge]...),
	}
	if sb.API.Backend == api.BackendFullVM {
		// A full VM's snapshot is a whole disk: a vm layer of its own.
		l.Kind, l.Parents = api.KindVM, nil
	}
	if err := s.store.PutLayer(ctx, l); err != nil {
		return store.Layer{}, 0, err
	}
	s.layers.forget() // the tag may have moved
	s.log.InfoContext(ctx, "snapshot stored", "tenant", sb.Tenant, "sandbox", sb.API.ID, "layer", name+":"+tag,
		"digest", res.Digest, "size", res.Size, "flattened", merge, "frozen_ms", res.FrozenMs)
	return l, time.Duration(res.FrozenMs) * time.Millisecond, nil
}

// snapshotDepth counts the snapshot layers on top of a stack.
func (s *Server) snapshotDepth(ctx context.Context, tenant string, stack []string) int {
	depth := 0
	for i := len(stack) - 1; i >= 0; i-- {
		l, err := s.store.LayerByDigest(ctx, tenant, stack[i])
		if err != nil || l.Kind != api.KindSnapshot {
			break
		}
		depth++
	}
	return depth
}

// snapshotStack resolves a create's snapshot ref to the stack it starts
// from: the snapshot's parents, then the snapshot.
func (s *Server) snapshotStack(ctx context.Context, tenant, ref string) ([]string, error) {
	l, err := s.resolveLayer(ctx, tenant, ref)
	if err != nil {
		return nil, err
	}
	if l.Kind == api.KindVM {
		return []string{l.Digest}, nil // a full VM's snapshot: the whole disk
	}
	if l.Kind != api.KindSnapshot {
		return nil, errdefs.Invalid("layer %s is a %s layer, not a snapshot", ref, l.Kind)
	}
	return append(append([]string(nil), l.Parents...), l.Digest), nil
}
