package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/sqlstore"
)

// SetQuota implements store.Store.
func (s *Store) SetQuota(ctx context.Context, tenant string, q store.Quota) error {
	if _, err := s.w.ExecContext(ctx, sqlstore.QuotaSet, sqlstore.QuotaArgs(tenant, q)...); err != nil {
		return fmt.Errorf("set quota: %w", err)
	}
	return nil
}

// Usage implements store.Store.
func (s *Store) Usage(ctx context.Context, tenant string) (store.Usage, error) {
	u, err := sqlstore.ScanUsage(s.r.QueryRowContext(ctx, sqlstore.UsageGet, tenant))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Usage{}, nil
	}
	if err != nil {
		return u, fmt.Errorf("tenant usage: %w", err)
	}
	return u, nil
}

// UpsertNode implements store.Store. Layers left nil keep the stored
// ones, read in the same transaction.
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
		args, err := sqlstore.NodeArgs(n)
		if err != nil {
			return err
		}
		_, err = tx.Exec(`INSERT INTO nodes (`+sqlstore.NodeUpsertCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET doc = excluded.doc, last_seen = excluded.last_seen,
				limit_mcpu = excluded.limit_mcpu, limit_memory_mb = excluded.limit_memory_mb,
				limit_pids = excluded.limit_pids, limit_disk_mb = excluded.limit_disk_mb`, args...)
		if err != nil {
			return fmt.Errorf("upsert node: %w", err)
		}
		return nil
	})
}

// GetNode implements store.Store.
func (s *Store) GetNode(ctx context.Context, id string) (store.Node, error) {
	n, err := sqlstore.ScanNode(s.r.QueryRowContext(ctx, sqlstore.NodeGet, id))
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
	rows, err := s.r.QueryContext(ctx, sqlstore.NodeList)
	return collect(rows, err, "list nodes", sqlstore.ScanNode)
}

// SetNodeState implements store.Store.
func (s *Store) SetNodeState(ctx context.Context, id string, from []string, state string, seenBefore time.Time) (bool, error) {
	if len(from) == 0 {
		return false, errdefs.Invalid("set node state: no from states")
	}
	q, args := sqlstore.NodeStateQuery(id, from, state, seenBefore, dialect)
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
		res, err := tx.Exec(sqlstore.NodeDrain, sqlstore.B2i(drain), id)
		if err != nil {
			return fmt.Errorf("drain node %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errdefs.NotFound("node %s", id)
		}
		return nil
	})
}
