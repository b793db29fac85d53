package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/sqlstore"
)

// SetQuota implements store.Store.
func (s *Store) SetQuota(ctx context.Context, tenant string, q store.Quota) error {
	if _, err := s.pool.Exec(ctx, quotaSet, sqlstore.QuotaArgs(tenant, q)...); err != nil {
		return fmt.Errorf("set quota: %w", err)
	}
	return nil
}

// Usage implements store.Store.
func (s *Store) Usage(ctx context.Context, tenant string) (store.Usage, error) {
	u, err := sqlstore.ScanUsage(s.pool.QueryRow(ctx, usageGet, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Usage{}, nil
	}
	if err != nil {
		return u, fmt.Errorf("tenant usage: %w", err)
	}
	return u, nil
}

// nodeUpsert keeps the stored layers when the new ones are nil ($10): jsonb
// ||, in the same statement.
var nodeUpsert = rebind(`INSERT INTO nodes (` + sqlstore.NodeUpsertCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET
			doc = CASE WHEN ? THEN excluded.doc || jsonb_build_object('Layers', nodes.doc->'Layers') ELSE excluded.doc END,
			last_seen = excluded.last_seen, limit_mcpu = excluded.limit_mcpu,
			limit_memory_mb = excluded.limit_memory_mb, limit_pids = excluded.limit_pids,
			limit_disk_mb = excluded.limit_disk_mb`)

// UpsertNode implements store.Store. Layers left nil keep the stored
// ones.
func (s *Store) UpsertNode(ctx context.Context, n store.Node) error {
	args, err := sqlstore.NodeArgs(n)
	if err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, nodeUpsert, append(args, n.Layers == nil)...); err != nil {
		return fmt.Errorf("upsert node: %w", err)
	}
	return nil
}

// GetNode implements store.Store.
func (s *Store) GetNode(ctx context.Context, id string) (store.Node, error) {
	n, err := sqlstore.ScanNode(s.pool.QueryRow(ctx, nodeGet, id))
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
	rows, err := s.pool.Query(ctx, sqlstore.NodeList)
	return collect(rows, err, "list nodes", sqlstore.ScanNode)
}

// SetNodeState implements store.Store.
func (s *Store) SetNodeState(ctx context.Context, id string, from []string, state string, seenBefore time.Time) (bool, error) {
	if len(from) == 0 {
		return false, errdefs.Invalid("set node state: no from states")
	}
	q, args := sqlstore.NodeStateQuery(id, from, state, seenBefore, dialect)
	tag, err := s.pool.Exec(ctx, rebind(q), args...)
	if err != nil {
		return false, fmt.Errorf("set node %s %s: %w", id, state, err)
	}
	return tag.RowsAffected() == 1, nil
}

// SetNodeDrain implements store.Store.
func (s *Store) SetNodeDrain(ctx context.Context, id string, drain bool) error {
	tag, err := s.pool.Exec(ctx, nodeDrain, sqlstore.B2i(drain), id)
	if err != nil {
		return fmt.Errorf("drain node %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return errdefs.NotFound("node %s", id)
	}
	return nil
}
