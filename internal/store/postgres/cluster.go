package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// SetQuota implements store.Store.
func (s *Store) SetQuota(ctx context.Context, tenant string, q store.Quota) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO tenant_usage (tenant, max_sandboxes, max_mcpu, max_memory_mb)
		VALUES ($1, $2, $3, $4) ON CONFLICT (tenant) DO UPDATE SET max_sandboxes = excluded.max_sandboxes,
		max_mcpu = excluded.max_mcpu, max_memory_mb = excluded.max_memory_mb`,
		tenant, q.Sandboxes, store.MilliCPU(q.CPU), q.MemoryMB)
	if err != nil {
		return fmt.Errorf("set quota: %w", err)
	}
	return nil
}

// Usage implements store.Store.
func (s *Store) Usage(ctx context.Context, tenant string) (store.Usage, error) {
	var u store.Usage
	var maxMCPU, mcpu int64
	err := s.pool.QueryRow(ctx, `SELECT max_sandboxes, max_mcpu, max_memory_mb, sandboxes, mcpu, memory_mb
		FROM tenant_usage WHERE tenant = $1`, tenant).
		Scan(&u.Quota.Sandboxes, &maxMCPU, &u.Quota.MemoryMB, &u.Sandboxes, &mcpu, &u.MemoryMB)
	if errors.Is(err, pgx.ErrNoRows) {
		return u, nil
	}
	if err != nil {
		return u, fmt.Errorf("tenant usage: %w", err)
	}
	u.Quota.CPU, u.CPU = float64(maxMCPU)/1000, float64(mcpu)/1000
	return u, nil
}

// nodeDoc is what of a node lives in the JSON document; the rest is in
// columns.
func nodeDoc(n store.Node) ([]byte, error) {
	n.State, n.Drain, n.LastSeen = "", false, time.Time{}
	n.Allocated, n.Sandboxes = api.Resources{}, 0
	return json.Marshal(n)
}

// UpsertNode implements store.Store. Layers left nil keep the stored
// ones (jsonb ||, in the same statement).
func (s *Store) UpsertNode(ctx context.Context, n store.Node) error {
	keep := n.Layers == nil
	doc, err := nodeDoc(n)
	if err != nil {
		return fmt.Errorf("encode node: %w", err)
	}
	state := n.State
	if state == "" {
		state = store.NodeUp
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO nodes (id, doc, state, drain, last_seen, limit_mcpu, limit_memory_mb, limit_pids)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (id) DO UPDATE SET
			doc = CASE WHEN $9 THEN excluded.doc || jsonb_build_object('Layers', nodes.doc->'Layers') ELSE excluded.doc END,
			last_seen = excluded.last_seen, limit_mcpu = excluded.limit_mcpu,
			limit_memory_mb = excluded.limit_memory_mb, limit_pids = excluded.limit_pids`,
		n.ID, string(doc), state, b2i(n.Drain), nanos(n.LastSeen), store.MilliCPU(n.Limit.CPU), n.Limit.MemoryMB, n.Limit.Pids, keep)
	if err != nil {
		return fmt.Errorf("upsert node: %w", err)
	}
	return nil
}

const nodeCols = `doc, state, drain, last_seen, limit_mcpu, limit_memory_mb, limit_pids,
	alloc_mcpu, alloc_memory_mb, alloc_pids, sandboxes`

func scanNode(r pgx.Row) (store.Node, error) {
	var n store.Node
	var doc []byte
	var drain int
	var seen, limitMCPU, allocMCPU, count int64
	if err := r.Scan(&doc, &n.State, &drain, &seen, &limitMCPU, &n.Limit.MemoryMB, &n.Limit.Pids,
		&allocMCPU, &n.Allocated.MemoryMB, &n.Allocated.Pids, &count); err != nil {
		return n, err
	}
	state, limit, alloc := n.State, n.Limit, n.Allocated
	if err := json.Unmarshal(doc, &n); err != nil {
		return n, fmt.Errorf("decode node: %w", err)
	}
	n.State, n.Drain, n.Limit, n.Allocated, n.Sandboxes = state, drain == 1, limit, alloc, int(count)
	n.LastSeen = fromNanos(seen)
	n.Limit.CPU, n.Allocated.CPU = float64(limitMCPU)/1000, float64(allocMCPU)/1000
	return n, nil
}

// GetNode implements store.Store.
func (s *Store) GetNode(ctx context.Context, id string) (store.Node, error) {
	n, err := scanNode(s.pool.QueryRow(ctx, `SELECT `+nodeCols+` FROM nodes WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return n, errdefs.NotFound("node %s", id)
	}
	if err != nil {
		return n, fmt.Errorf("get node: %w", err)
	}
	return n, nil
}

// ListNodes implements store.Store.
func (s *Store) ListNodes(ctx context.Context) ([]store.Node, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+nodeCols+` FROM nodes ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Node, error) { return scanNode(r) })
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

// SetNodeState implements store.Store.
func (s *Store) SetNodeState(ctx context.Context, id string, from []string, state string, seenBefore time.Time) (bool, error) {
	if len(from) == 0 {
		return false, errdefs.Invalid("set node state: no from states")
	}
	before := int64(1<<63 - 1)
	if !seenBefore.IsZero() {
		before = nanos(seenBefore)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE nodes SET state = $1 WHERE id = $2 AND state = ANY($3) AND last_seen < $4`,
		state, id, from, before)
	if err != nil {
		return false, fmt.Errorf("set node %s %s: %w", id, state, err)
	}
	return tag.RowsAffected() == 1, nil
}

// SetNodeDrain implements store.Store.
func (s *Store) SetNodeDrain(ctx context.Context, id string, drain bool) error {
	tag, err := s.pool.Exec(ctx, `UPDATE nodes SET drain = $1 WHERE id = $2`, b2i(drain), id)
	if err != nil {
		return fmt.Errorf("drain node %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return errdefs.NotFound("node %s", id)
	}
	return nil
}
