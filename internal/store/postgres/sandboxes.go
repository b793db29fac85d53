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

// CreateSandbox implements store.Store.
func (s *Store) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sqlstore.SandboxArgs(sb)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, sandboxInsert, sqlstore.InsertArgs(args, false)...)
	if isUnique(err) {
		return fmt.Errorf("sandbox %s: %w", sb.API.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	sb.Version = 1
	return nil
}

// CreateSandboxes implements store.Store: one transaction, the inserts
// pipelined.
func (s *Store) CreateSandboxes(ctx context.Context, list []*store.Sandbox) error {
	if len(list) == 0 {
		return nil
	}
	var b pgx.Batch
	for _, sb := range list {
		args, err := sqlstore.SandboxArgs(sb)
		if err != nil {
			return err
		}
		b.Queue(sandboxInsert, sqlstore.InsertArgs(args, false)...)
	}
	err := s.tx(ctx, func(tx pgx.Tx) error {
		res := tx.SendBatch(ctx, &b)
		defer res.Close()
		for _, sb := range list {
			if _, err := res.Exec(); isUnique(err) {
				return fmt.Errorf("sandbox %s: %w", sb.API.ID, errdefs.ErrAlreadyExists)
			} else if err != nil {
				return fmt.Errorf("create sandboxes: %w", err)
			}
		}
		return res.Close()
	})
	if err != nil {
		return err
	}
	for _, sb := range list {
		sb.Version = 1
	}
	return nil
}

// PlaceSandboxes implements store.Store. The charges and inserts go to
// the server in one pipelined batch, inside a group transaction (see
// batcher.go).
func (s *Store) PlaceSandboxes(ctx context.Context, sbs []*store.Sandbox) error {
	if len(sbs) == 0 {
		return nil
	}
	nodes := sqlstore.Sum(sbs, func(sb *store.Sandbox) string { return sb.API.Node })
	tenants := sqlstore.Sum(sbs, func(sb *store.Sandbox) string { return sb.Tenant })
	inserts := make([][]any, 0, len(sbs))
	for _, sb := range sbs {
		args, err := sqlstore.SandboxArgs(sb)
		if err != nil {
			return err
		}
		inserts = append(inserts, sqlstore.InsertArgs(args, true))
	}
	err := s.batcher.place(ctx, &placeOp{sbs: sbs, nodes: nodes.Keys, tenants: tenants.Keys, queue: func(b *pgx.Batch) {
		for _, id := range nodes.Keys {
			b.Queue(nodeCharge, sqlstore.NodeChargeArgs(id, *nodes.By[id])...)
		}
		for _, id := range tenants.Keys {
			b.Queue(tenantCharge, sqlstore.TenantChargeArgs(id, *tenants.By[id])...)
		}
		for _, args := range inserts {
			b.Queue(sandboxInsert, args...)
		}
	}})
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		sb.Version = 1
	}
	return nil
}

// readStored reads a record's charge and locks its row.
func readStored(ctx context.Context, tx pgx.Tx, id string) (sqlstore.Stored, error) {
	st, err := sqlstore.ScanStored(tx.QueryRow(ctx, storedGet, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return st, errdefs.NotFound("sandbox %s", id)
	}
	if err != nil {
		return st, fmt.Errorf("read sandbox %s: %w", id, err)
	}
	return st, nil
}

// release returns one record's charge, as stored.
func release(ctx context.Context, tx pgx.Tx, st sqlstore.Stored) error {
	if _, err := tx.Exec(ctx, nodeRelease, sqlstore.NodeReleaseArgs(st.Node, st.Charge)...); err != nil {
		return fmt.Errorf("release node %s: %w", st.Node, err)
	}
	if _, err := tx.Exec(ctx, tenantRelease, sqlstore.TenantReleaseArgs(st.Tenant, st.Charge)...); err != nil {
		return fmt.Errorf("release tenant %s: %w", st.Tenant, err)
	}
	return nil
}

// UpdateSandbox implements store.Store. The common update, one that ends
// nothing of a live record, is one statement (one round trip, pipelined
// with others by the batcher); the rest run in a transaction.
func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sqlstore.SandboxArgs(sb)
	if err != nil {
		return err
	}
	if sb.DeletedAt == nil {
		n, err := s.batcher.update(ctx, sb.API.ID, sqlstore.LiveUpdateArgs(args, sb))
		if err != nil {
			return err
		}
		if n == 1 {
			sb.Version++
			return nil
		}
		// Not found, changed, moved or ended: the full path says which.
	}
	err = s.tx(ctx, func(tx pgx.Tx) error {
		st, err := readStored(ctx, tx, sb.API.ID)
		if err != nil {
			return err
		}
		upd, rel, err := sqlstore.Update(sb, args, st)
		if err != nil {
			return err
		}
		if rel {
			if err := release(ctx, tx, st); err != nil {
				return err
			}
		}
		tag, err := tx.Exec(ctx, sandboxUpdate, upd...)
		if err != nil {
			return fmt.Errorf("update sandbox: %w", err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("update sandbox %s: %w", sb.API.ID, store.ErrConflict)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sb.Version++
	return nil
}

// MoveSandbox implements store.Store. The record keeps the charge it
// holds, moved from its node to the new one.
func (s *Store) MoveSandbox(ctx context.Context, sb *store.Sandbox, node string) error {
	_, args, err := sqlstore.Moved(sb, node)
	if err != nil {
		return err
	}
	err = s.tx(ctx, func(tx pgx.Tx) error {
		st, err := readStored(ctx, tx, sb.API.ID)
		if err != nil {
			return err
		}
		if err := sqlstore.CheckMove(sb, st); err != nil {
			return err
		}
		c := st.Charge
		// Lock the two node rows in id order.
		charge := func() error {
			tag, err := tx.Exec(ctx, nodeCharge, sqlstore.NodeChargeArgs(node, c)...)
			if err != nil {
				return fmt.Errorf("charge node %s: %w", node, err)
			}
			if tag.RowsAffected() != 1 {
				return &store.PlaceError{Node: node, Err: store.ErrNodeFull}
			}
			return nil
		}
		releaseOld := func() error {
			_, err := tx.Exec(ctx, nodeRelease, sqlstore.NodeReleaseArgs(st.Node, c)...)
			return err
		}
		steps := []func() error{releaseOld, charge}
		if node < st.Node {
			steps = []func() error{charge, releaseOld}
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return err
			}
		}
		sqlstore.SetCharge(args, c)
		_, err = tx.Exec(ctx, sandboxUpdate, sqlstore.UpdateArgs(args, sb, true)...)
		return err
	})
	if err != nil {
		return err
	}
	sb.API.Node = node
	sb.Version++
	return nil
}

// MarkSandboxesLost implements store.Store.
func (s *Store) MarkSandboxesLost(ctx context.Context, node string) (int, error) {
	tag, err := s.pool.Exec(ctx, sandboxesLost, node)
	if err != nil {
		return 0, fmt.Errorf("mark sandboxes of node %s lost: %w", node, err)
	}
	return int(tag.RowsAffected()), nil
}

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := sqlstore.ScanSandbox(s.pool.QueryRow(ctx, sandboxGet, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Sandbox{}, errdefs.NotFound("sandbox %s", id)
	}
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("get sandbox: %w", err)
	}
	return sb, nil
}

// TouchSandbox implements store.Store.
func (s *Store) TouchSandbox(ctx context.Context, id string, t time.Time) error {
	if _, err := s.pool.Exec(ctx, sandboxTouch, sqlstore.Nanos(t), id); err != nil {
		return fmt.Errorf("touch sandbox: %w", err)
	}
	return nil
}

// dialect matches states with one array parameter and reads labels with
// jsonb operators, the key a parameter too.
var dialect = sqlstore.Dialect{
	StateIn: func(states []string) (string, []any) { return "state = ANY(?)", []any{states} },
	Label: func(k, v string) (string, []any) {
		return "doc->'API'->'labels'->>? = ?", []any{k, v}
	},
	DocHas: func(s string) (string, []any) { return "strpos(doc::text, ?) > 0", []any{s} },
}

// ListSandboxes implements store.Store. Pages are in id order; the page
// token is the last id of the previous page.
func (s *Store) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, string, error) {
	q, args, err := sqlstore.ListQuery(f, dialect)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.pool.Query(ctx, rebind(q), args...)
	out, err := collect(rows, err, "list sandboxes", sqlstore.ScanSandbox)
	if err != nil {
		return nil, "", err
	}
	out, next := sqlstore.Page(out, f.Limit)
	return out, next, nil
}

// CountSandboxes implements store.Store.
func (s *Store) CountSandboxes(ctx context.Context, tenant string) ([]store.SandboxCount, error) {
	q, args := sqlstore.CountQuery(tenant)
	rows, err := s.pool.Query(ctx, rebind(q), args...)
	return collect(rows, err, "count sandboxes", sqlstore.ScanCount)
}

// PurgeSandboxes implements store.Store.
func (s *Store) PurgeSandboxes(ctx context.Context, deletedBefore time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, sandboxPurge, sqlstore.Nanos(deletedBefore))
	if err != nil {
		return 0, fmt.Errorf("purge sandboxes: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
