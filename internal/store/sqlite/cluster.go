package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// SetQuota implements store.Store.
func (s *Store) SetQuota(ctx context.Context, tenant string, q store.Quota) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO tenant_usage (tenant, max_sandboxes, max_mcpu, max_memory_mb)
		VALUES (?, ?, ?, ?) ON CONFLICT (tenant) DO UPDATE SET max_sandboxes = excluded.max_sandboxes,
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
	err := s.r.QueryRowContext(ctx, `SELECT max_sandboxes, max_mcpu, max_memory_mb, sandboxes, mcpu, memory_mb
		FROM tenant_usage WHERE tenant = ?`, tenant).
		Scan(&u.Quota.Sandboxes, &maxMCPU, &u.Quota.MemoryMB, &u.Sandboxes, &mcpu, &u.MemoryMB)
	if errors.Is(err, sql.ErrNoRows) {
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

// UpsertNode implements store.Store.
func (s *Store) UpsertNode(ctx context.Context, n store.Node) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		if n.Layers == nil {
			var doc []byte
			err := tx.QueryRow(`SELECT doc FROM nodes WHERE id = ?`, n.ID).Scan(&doc)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("upsert node: %w", err)
			}
			if err == nil {
				var old store.Node
				if err := json.Unmarshal(doc, &old); err == nil {
					n.Layers = old.Layers
				}
			}
		}
		doc, err := nodeDoc(n)
		if err != nil {
			return fmt.Errorf("encode node: %w", err)
		}
		state := n.State
		if state == "" {
			state = store.NodeUp
		}
		_, err = tx.Exec(`INSERT INTO nodes (id, doc, state, drain, last_seen, limit_mcpu, limit_memory_mb, limit_pids)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET doc = excluded.doc, last_seen = excluded.last_seen,
				limit_mcpu = excluded.limit_mcpu, limit_memory_mb = excluded.limit_memory_mb,
				limit_pids = excluded.limit_pids`,
			n.ID, string(doc), state, n.Drain, nanos(n.LastSeen), store.MilliCPU(n.Limit.CPU), n.Limit.MemoryMB, n.Limit.Pids)
		if err != nil {
			return fmt.Errorf("upsert node: %w", err)
		}
		return nil
	})
}

const nodeCols = `doc, state, drain, last_seen, limit_mcpu, limit_memory_mb, limit_pids,
	alloc_mcpu, alloc_memory_mb, alloc_pids, sandboxes`

func scanNode(sc interface{ Scan(...any) error }) (store.Node, error) {
	var n store.Node
	var doc []byte
	var seen, limitMCPU, allocMCPU int64
	if err := sc.Scan(&doc, &n.State, &n.Drain, &seen, &limitMCPU, &n.Limit.MemoryMB, &n.Limit.Pids,
		&allocMCPU, &n.Allocated.MemoryMB, &n.Allocated.Pids, &n.Sandboxes); err != nil {
		return n, err
	}
	state, drain, limit, alloc, count := n.State, n.Drain, n.Limit, n.Allocated, n.Sandboxes
	if err := json.Unmarshal(doc, &n); err != nil {
		return n, fmt.Errorf("decode node: %w", err)
	}
	n.State, n.Drain, n.Limit, n.Allocated, n.Sandboxes = state, drain, limit, alloc, count
	n.LastSeen = fromNanos(seen)
	n.Limit.CPU, n.Allocated.CPU = float64(limitMCPU)/1000, float64(allocMCPU)/1000
	return n, nil
}

// GetNode implements store.Store.
func (s *Store) GetNode(ctx context.Context, id string) (store.Node, error) {
	n, err := scanNode(s.r.QueryRowContext(ctx, `SELECT `+nodeCols+` FROM nodes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return n, errdefs.NotFound("node %s", id)
	}
	if err != nil {
		return n, fmt.Errorf("get node: %w", err)
	}
	return n, nil
}

// ListNodes implements store.Store.
func (s *Store) ListNodes(ctx context.Context) ([]store.Node, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+nodeCols+` FROM nodes ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	var out []store.Node
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// SetNodeState implements store.Store.
func (s *Store) SetNodeState(ctx context.Context, id string, from []string, state string, seenBefore time.Time) (bool, error) {
	if len(from) == 0 {
		return false, errdefs.Invalid("set node state: no from states")
	}
	q := `UPDATE nodes SET state = ? WHERE id = ? AND state IN (?` + strings.Repeat(", ?", len(from)-1) + `)`
	args := []any{state, id}
	for _, f := range from {
		args = append(args, f)
	}
	if !seenBefore.IsZero() {
		q += ` AND last_seen < ?`
		args = append(args, nanos(seenBefore))
	}
	var changed bool
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.Exec(q, args...)
		if err != nil {
			return fmt.Errorf("set node %s %s: %w", id, state, err)
		}
		n, _ := res.RowsAffected()
		changed = n == 1
		return nil
	})
	return changed, err
}

// SetNodeDrain implements store.Store.
func (s *Store) SetNodeDrain(ctx context.Context, id string, drain bool) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.Exec(`UPDATE nodes SET drain = ? WHERE id = ?`, drain, id)
		if err != nil {
			return fmt.Errorf("drain node %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errdefs.NotFound("node %s", id)
		}
		return nil
	})
}
