package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/sqlstore"
)

func (s *Store) insertSandbox(tx *sql.Tx, sb *store.Sandbox, charged bool) error {
	args, err := sqlstore.SandboxArgs(sb)
	if err != nil {
		return err
	}
	_, err = s.exec(tx, sqlstore.SandboxInsert, sqlstore.InsertArgs(args, charged)...)
	if isUnique(err) {
		return fmt.Errorf("sandbox %s: %w", sb.API.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("insert sandbox: %w", err)
	}
	return nil
}

// CreateSandbox implements store.Store.
func (s *Store) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	return s.CreateSandboxes(ctx, []*store.Sandbox{sb})
}

// CreateSandboxes implements store.Store: one transaction (shared with
// other writes, see writer.go), one prepared statement.
func (s *Store) CreateSandboxes(ctx context.Context, list []*store.Sandbox) error {
	return s.insertSandboxes(ctx, list, false)
}

// PlaceSandboxes implements store.Store.
func (s *Store) PlaceSandboxes(ctx context.Context, sbs []*store.Sandbox) error {
	return s.insertSandboxes(ctx, sbs, true)
}

// insertSandboxes inserts records in one write, charged to their nodes
// and tenants first if charged.
func (s *Store) insertSandboxes(ctx context.Context, sbs []*store.Sandbox, charged bool) error {
	if len(sbs) == 0 {
		return nil
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		if charged {
			if err := s.charge(tx, sbs); err != nil {
				return err
			}
		}
		for _, sb := range sbs {
			if err := s.insertSandbox(tx, sb, charged); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		sb.Version = 1
	}
	return nil
}

// charge books the sandboxes' resources on their nodes and
// tenants, or fails with a *store.PlaceError having changed nothing the
// caller's savepoint does not undo.
func (s *Store) charge(tx *sql.Tx, sbs []*store.Sandbox) error {
	nodes := sqlstore.Sum(sbs, func(sb *store.Sandbox) string { return sb.API.Node })
	for _, id := range nodes.Keys {
		res, err := s.exec(tx, sqlstore.NodeCharge, sqlstore.NodeChargeArgs(id, *nodes.By[id])...)
		if err != nil {
			return fmt.Errorf("charge node %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return &store.PlaceError{Node: id, Err: store.ErrNodeFull}
		}
	}
	tenants := sqlstore.Sum(sbs, func(sb *store.Sandbox) string { return sb.Tenant })
	for _, id := range tenants.Keys {
		res, err := s.exec(tx, sqlstore.TenantCharge, sqlstore.TenantChargeArgs(id, *tenants.By[id])...)
		if err != nil {
			return fmt.Errorf("charge tenant %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return &store.PlaceError{Tenant: id, Err: store.ErrQuotaExceeded}
		}
	}
	return nil
}

// release returns one record's charge, as stored.
func (s *Store) release(tx *sql.Tx, st sqlstore.Stored) error {
	if _, err := s.exec(tx, sqlstore.NodeRelease, sqlstore.NodeReleaseArgs(st.Node, st.Charge)...); err != nil {
		return fmt.Errorf("release node %s: %w", st.Node, err)
	}
	if _, err := s.exec(tx, sqlstore.TenantRelease, sqlstore.TenantReleaseArgs(st.Tenant, st.Charge)...); err != nil {
		return fmt.Errorf("release tenant %s: %w", st.Tenant, err)
	}
	return nil
}

func (s *Store) readStored(tx *sql.Tx, id string) (sqlstore.Stored, error) {
	st, err := sqlstore.ScanStored(s.queryRow(tx, sqlstore.StoredGet, id))
	if errors.Is(err, sql.ErrNoRows) {
		return st, errdefs.NotFound("sandbox %s", id)
	}
	if err != nil {
		return st, fmt.Errorf("read sandbox %s: %w", id, err)
	}
	return st, nil
}

// UpdateSandbox implements store.Store.
func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sqlstore.SandboxArgs(sb)
	if err != nil {
		return err
	}
	err = s.write(ctx, func(tx *sql.Tx) error {
		if sb.DeletedAt == nil {
			res, err := s.exec(tx, sqlstore.SandboxUpdateLive, sqlstore.LiveUpdateArgs(args, sb)...)
			if err != nil {
				return fmt.Errorf("update sandbox: %w", err)
			}
			if n, _ := res.RowsAffected(); n == 1 {
				return nil
			}
			// Not found, changed, moved or ended: the full path says which.
		}
		st, err := s.readStored(tx, sb.API.ID)
		if err != nil {
			return err
		}
		upd, release, err := sqlstore.Update(sb, args, st)
		if err != nil {
			return err
		}
		if release {
			if err := s.release(tx, st); err != nil {
				return err
			}
		}
		res, err := s.exec(tx, sqlstore.SandboxUpdate, upd...)
		if err != nil {
			return fmt.Errorf("update sandbox: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
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

// MoveSandbox implements store.Store.
func (s *Store) MoveSandbox(ctx context.Context, sb *store.Sandbox, node string) error {
	_, args, err := sqlstore.Moved(sb, node)
	if err != nil {
		return err
	}
	err = s.write(ctx, func(tx *sql.Tx) error {
		st, err := s.readStored(tx, sb.API.ID)
		if err != nil {
			return err
		}
		if err := sqlstore.CheckMove(sb, st); err != nil {
			return err
		}
		// The stored charge moves from node to node; the tenant's usage
		// does not change, so its quota is not asked again.
		c := st.Charge
		if _, err := s.exec(tx, sqlstore.NodeRelease, sqlstore.NodeReleaseArgs(st.Node, c)...); err != nil {
			return fmt.Errorf("release node %s: %w", st.Node, err)
		}
		res, err := s.exec(tx, sqlstore.NodeCharge, sqlstore.NodeChargeArgs(node, c)...)
		if err != nil {
			return fmt.Errorf("charge node %s: %w", node, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return &store.PlaceError{Node: node, Err: store.ErrNodeFull}
		}
		sqlstore.SetCharge(args, c)
		if _, err := s.exec(tx, sqlstore.SandboxUpdate, sqlstore.UpdateArgs(args, sb, true)...); err != nil {
			return fmt.Errorf("move sandbox: %w", err)
		}
		return nil
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
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.Exec(sqlstore.SandboxesLost, node)
		if err != nil {
			return fmt.Errorf("mark sandboxes of node %s lost: %w", node, err)
		}
		n, _ = res.RowsAffected()
		return nil
	})
	return int(n), err
}

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := sqlstore.ScanSandbox(s.readRow(ctx, sqlstore.SandboxGet, id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Sandbox{}, errdefs.NotFound("sandbox %s", id)
	}
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("get sandbox: %w", err)
	}
	return sb, nil
}

// TouchSandbox implements store.Store.
func (s *Store) TouchSandbox(ctx context.Context, id string, t time.Time) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		if _, err := s.exec(tx, sqlstore.SandboxTouch, sqlstore.Nanos(t), id); err != nil {
			return fmt.Errorf("touch sandbox: %w", err)
		}
		return nil
	})
}

// dialect writes SQLite's IN lists and reads labels with json_extract
// (the key, checked, is part of the JSON path).
var dialect = sqlstore.Dialect{
	StateIn: func(states []string) (string, []any) {
		args := make([]any, len(states))
		for i, st := range states {
			args[i] = st
		}
		return "state IN (?" + strings.Repeat(",?", len(states)-1) + ")", args
	},
	Label: func(k, v string) (string, []any) {
		return `json_extract(doc, '$.API.labels."` + k + `"') = ?`, []any{v}
	},
	DocHas: func(s string) (string, []any) { return "instr(doc, ?) > 0", []any{s} },
}

// ListSandboxes implements store.Store. Pages are in id order; the page
// token is the last id of the previous page.
func (s *Store) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, string, error) {
	q, args, err := sqlstore.ListQuery(f, dialect)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
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
	rows, err := s.r.QueryContext(ctx, q, args...)
	return collect(rows, err, "count sandboxes", sqlstore.ScanCount)
}

// PurgeSandboxes implements store.Store.
func (s *Store) PurgeSandboxes(ctx context.Context, deletedBefore time.Time) (int, error) {
	res, err := s.w.ExecContext(ctx, sqlstore.SandboxPurge, sqlstore.Nanos(deletedBefore))
	if err != nil {
		return 0, fmt.Errorf("purge sandboxes: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}
