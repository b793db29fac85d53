package sqlite

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

const sandboxInsert = `INSERT INTO sandboxes (tenant, state, node, expires_at, deleted_at, last_active, doc,
	mcpu, memory_mb, pids, idle_timeout, id, version, charged) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)`

// sandboxArgs are the column values of a record, in sandboxInsert's order
// (without version and charged): args[10] is the idle timeout, args[11]
// the id.
func sandboxArgs(sb *store.Sandbox) ([]any, error) {
	doc, err := json.Marshal(sb)
	if err != nil {
		return nil, fmt.Errorf("encode sandbox: %w", err)
	}
	var expires, deleted any
	if sb.API.ExpiresAt != nil {
		expires = nanos(*sb.API.ExpiresAt)
	}
	if sb.DeletedAt != nil {
		deleted = nanos(*sb.DeletedAt)
	}
	r := sb.API.Resources
	idle := sb.API.IdleTimeoutSeconds * int64(time.Second)
	return []any{sb.Tenant, sb.API.State, sb.API.Node, expires, deleted, nanos(sb.LastActive), string(doc),
		store.MilliCPU(r.CPU), r.MemoryMB, r.Pids, idle, sb.API.ID}, nil
}

func (s *Store) insertSandbox(tx *sql.Tx, sb *store.Sandbox, charged bool) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	_, err = s.exec(tx, sandboxInsert, append(args, charged)...)
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
	err := s.write(ctx, func(tx *sql.Tx) error { return s.insertSandbox(tx, sb, false) })
	if err != nil {
		return err
	}
	sb.Version = 1
	return nil
}

// CreateSandboxes implements store.Store: one transaction (shared with
// other writes, see writer.go), one prepared statement.
func (s *Store) CreateSandboxes(ctx context.Context, list []*store.Sandbox) error {
	if len(list) == 0 {
		return nil
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		for _, sb := range list {
			if err := s.insertSandbox(tx, sb, false); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, sb := range list {
		sb.Version = 1
	}
	return nil
}

// PlaceSandboxes implements store.Store.
func (s *Store) PlaceSandboxes(ctx context.Context, sbs []*store.Sandbox) error {
	if len(sbs) == 0 {
		return nil
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		if err := s.charge(tx, sbs); err != nil {
			return err
		}
		for _, sb := range sbs {
			if err := s.insertSandbox(tx, sb, true); err != nil {
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

// totals sums charges by key, keys sorted (a fixed lock order).
type totals struct {
	keys []string
	by   map[string]*store.Charge
}

func sum(sbs []*store.Sandbox, key func(*store.Sandbox) string) totals {
	t := totals{by: map[string]*store.Charge{}}
	for _, sb := range sbs {
		k := key(sb)
		c, ok := t.by[k]
		if !ok {
			c = &store.Charge{}
			t.by[k] = c
			t.keys = append(t.keys, k)
		}
		c.Add(store.ChargeOf(sb.API.Resources))
	}
	slices.Sort(t.keys)
	return t
}

const (
	nodeCharge = `UPDATE nodes SET alloc_mcpu = alloc_mcpu + ?, alloc_memory_mb = alloc_memory_mb + ?,
		alloc_pids = alloc_pids + ?, sandboxes = sandboxes + ?
	WHERE id = ? AND state = 'up' AND drain = 0 AND alloc_memory_mb + ? <= limit_memory_mb
		AND (limit_mcpu = 0 OR alloc_mcpu + ? <= limit_mcpu) AND (limit_pids = 0 OR alloc_pids + ? <= limit_pids)`
	nodeRelease = `UPDATE nodes SET alloc_mcpu = alloc_mcpu - ?, alloc_memory_mb = alloc_memory_mb - ?,
		alloc_pids = alloc_pids - ?, sandboxes = sandboxes - ? WHERE id = ?`
	tenantCharge = `INSERT INTO tenant_usage (tenant, sandboxes, mcpu, memory_mb) VALUES (?, ?, ?, ?)
	ON CONFLICT (tenant) DO UPDATE SET sandboxes = tenant_usage.sandboxes + excluded.sandboxes,
		mcpu = tenant_usage.mcpu + excluded.mcpu, memory_mb = tenant_usage.memory_mb + excluded.memory_mb
	WHERE (tenant_usage.max_sandboxes = 0 OR tenant_usage.sandboxes + excluded.sandboxes <= tenant_usage.max_sandboxes)
		AND (tenant_usage.max_mcpu = 0 OR tenant_usage.mcpu + excluded.mcpu <= tenant_usage.max_mcpu)
		AND (tenant_usage.max_memory_mb = 0 OR tenant_usage.memory_mb + excluded.memory_mb <= tenant_usage.max_memory_mb)`
	tenantRelease = `UPDATE tenant_usage SET sandboxes = sandboxes - ?, mcpu = mcpu - ?, memory_mb = memory_mb - ?
	WHERE tenant = ?`
)

// charge books the sandboxes' resources on their nodes and
// tenants, or fails with a *store.PlaceError having changed nothing the
// caller's savepoint does not undo.
func (s *Store) charge(tx *sql.Tx, sbs []*store.Sandbox) error {
	nodes := sum(sbs, func(sb *store.Sandbox) string { return sb.API.Node })
	for _, id := range nodes.keys {
		c := nodes.by[id]
		res, err := s.exec(tx, nodeCharge, c.MilliCPU, c.MemoryMB, c.Pids, c.Sandboxes, id, c.MemoryMB, c.MilliCPU, c.Pids)
		if err != nil {
			return fmt.Errorf("charge node %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return &store.PlaceError{Node: id, Err: store.ErrNodeFull}
		}
	}
	tenants := sum(sbs, func(sb *store.Sandbox) string { return sb.Tenant })
	for _, id := range tenants.keys {
		c := tenants.by[id]
		res, err := s.exec(tx, tenantCharge, id, c.Sandboxes, c.MilliCPU, c.MemoryMB)
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
func (s *Store) release(tx *sql.Tx, node, tenant string, c store.Charge) error {
	if _, err := s.exec(tx, nodeRelease, c.MilliCPU, c.MemoryMB, c.Pids, 1, node); err != nil {
		return fmt.Errorf("release node %s: %w", node, err)
	}
	if _, err := s.exec(tx, tenantRelease, 1, c.MilliCPU, c.MemoryMB, tenant); err != nil {
		return fmt.Errorf("release tenant %s: %w", tenant, err)
	}
	return nil
}

// stored is what a record's columns say about its charge.
type stored struct {
	version int64
	charged bool
	node    string
	tenant  string
	charge  store.Charge
}

const readStoredQuery = `SELECT version, charged, node, tenant, mcpu, memory_mb, pids FROM sandboxes WHERE id = ?`

func (s *Store) readStored(tx *sql.Tx, id string) (stored, error) {
	var st stored
	err := s.queryRow(tx, readStoredQuery, id).
		Scan(&st.version, &st.charged, &st.node, &st.tenant, &st.charge.MilliCPU, &st.charge.MemoryMB, &st.charge.Pids)
	if errors.Is(err, sql.ErrNoRows) {
		return st, errdefs.NotFound("sandbox %s", id)
	}
	if err != nil {
		return st, fmt.Errorf("read sandbox %s: %w", id, err)
	}
	st.charge.Sandboxes = 1
	return st, nil
}

const sandboxUpdate = `UPDATE sandboxes SET tenant = ?, state = ?, node = ?, expires_at = ?, deleted_at = ?,
	last_active = ?, doc = ?, mcpu = ?, memory_mb = ?, pids = ?, idle_timeout = ?, charged = ?, version = version + 1
	WHERE id = ? AND version = ?`

// sandboxUpdateLive is UpdateSandbox's one-statement path for the common
// update, one that ends nothing (DeletedAt stays nil) of a record that is
// live: its charge, node and tenant stay as they are.
const sandboxUpdateLive = `UPDATE sandboxes SET state = ?, expires_at = ?, last_active = ?, doc = ?, idle_timeout = ?, version = version + 1
	WHERE id = ? AND version = ? AND node = ? AND tenant = ? AND deleted_at IS NULL`

// UpdateSandbox implements store.Store.
func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	err = s.write(ctx, func(tx *sql.Tx) error {
		if sb.DeletedAt == nil {
			res, err := s.exec(tx, sandboxUpdateLive, args[1], args[3], args[5], args[6], args[10], sb.API.ID, sb.Version, sb.API.Node, sb.Tenant)
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
		if st.version != sb.Version {
			return fmt.Errorf("update sandbox %s: %w", sb.API.ID, store.ErrConflict)
		}
		charged := st.charged
		if charged {
			if sb.API.Node != st.node || sb.Tenant != st.tenant {
				return errdefs.Invalid("sandbox %s: a charged record changes node only through MoveSandbox", sb.API.ID)
			}
			// The charge is what was booked, whatever the record now says.
			args[7], args[8], args[9] = st.charge.MilliCPU, st.charge.MemoryMB, st.charge.Pids
			if sb.DeletedAt != nil {
				if err := s.release(tx, st.node, st.tenant, st.charge); err != nil {
					return err
				}
				charged = false
			}
		}
		res, err := s.exec(tx, sandboxUpdate, append(args[:11:11], charged, sb.API.ID, sb.Version)...)
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
	moved := *sb
	moved.API.Node = node
	args, err := sandboxArgs(&moved)
	if err != nil {
		return err
	}
	err = s.write(ctx, func(tx *sql.Tx) error {
		st, err := s.readStored(tx, sb.API.ID)
		if err != nil {
			return err
		}
		if st.version != sb.Version {
			return fmt.Errorf("move sandbox %s: %w", sb.API.ID, store.ErrConflict)
		}
		if !st.charged {
			return fmt.Errorf("move sandbox %s: it holds no charge: %w", sb.API.ID, errdefs.ErrFailedPrecondition)
		}
		if err := s.release(tx, st.node, st.tenant, st.charge); err != nil {
			return err
		}
		if err := s.charge(tx, []*store.Sandbox{&moved}); err != nil {
			return err
		}
		if _, err := s.exec(tx, sandboxUpdate, append(args[:11:11], true, sb.API.ID, sb.Version)...); err != nil {
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
		res, err := tx.Exec(`UPDATE sandboxes SET state = 'lost', version = version + 1
			WHERE node = ? AND state IN ('creating', 'running', 'paused')`, node)
		if err != nil {
			return fmt.Errorf("mark sandboxes of node %s lost: %w", node, err)
		}
		n, _ = res.RowsAffected()
		return nil
	})
	return int(n), err
}

const getSandboxQuery = `SELECT ` + sandboxCols + ` FROM sandboxes WHERE id = ?`

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := scanSandbox(s.readRow(ctx, getSandboxQuery, id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Sandbox{}, errdefs.NotFound("sandbox %s", id)
	}
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("get sandbox: %w", err)
	}
	return sb, nil
}

// sandboxCols: the state column is authoritative (MarkSandboxesLost sets
// it without rewriting the document).
const sandboxCols = `doc, last_active, version, state`

func scanSandbox(sc interface{ Scan(...any) error }) (store.Sandbox, error) {
	var sb store.Sandbox
	var doc []byte
	var active int64
	var state string
	if err := sc.Scan(&doc, &active, &sb.Version, &state); err != nil {
		return sb, err
	}
	if err := json.Unmarshal(doc, &sb); err != nil {
		return sb, fmt.Errorf("decode sandbox: %w", err)
	}
	sb.API.State = state
	sb.LastActive = fromNanos(active)
	return sb, nil
}

const touchQuery = `UPDATE sandboxes SET last_active = ? WHERE id = ?`

// TouchSandbox implements store.Store.
func (s *Store) TouchSandbox(ctx context.Context, id string, t time.Time) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		if _, err := s.exec(tx, touchQuery, nanos(t), id); err != nil {
			return fmt.Errorf("touch sandbox: %w", err)
		}
		return nil
	})
}

var labelKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)

// ListSandboxes implements store.Store. Pages are in id order; the page
// token is the last id of the previous page.
func (s *Store) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, string, error) {
	var where []string
	var args []any
	if !f.AllTenants {
		where = append(where, "tenant = ?")
		args = append(args, f.Tenant)
	}
	if f.Node != "" {
		where = append(where, "node = ?")
		args = append(args, f.Node)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN (?"+strings.Repeat(",?", len(f.States)-1)+")")
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	for k, v := range f.Labels {
		if !labelKey.MatchString(k) {
			return nil, "", errdefs.Invalid("label key %q", k)
		}
		where = append(where, `json_extract(doc, '$.API.labels."`+k+`"') = ?`)
		args = append(args, v)
	}
	if f.ExpiredBy != nil {
		where = append(where, "expires_at IS NOT NULL AND expires_at <= ?")
		args = append(args, nanos(*f.ExpiredBy))
	}
	if f.IdleBy != nil {
		where = append(where, "idle_timeout > 0 AND (last_active + idle_timeout) <= ?")
		args = append(args, nanos(*f.IdleBy))
	}
	if f.PageToken != "" {
		after, err := base64.RawURLEncoding.DecodeString(f.PageToken)
		if err != nil {
			return nil, "", errdefs.Invalid("bad page token")
		}
		where = append(where, "id > ?")
		args = append(args, string(after))
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id"
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit+1)
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []store.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, "", fmt.Errorf("list sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("list sandboxes: %w", err)
	}
	var next string
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
		next = base64.RawURLEncoding.EncodeToString([]byte(out[len(out)-1].API.ID))
	}
	return out, next, nil
}

// PurgeSandboxes implements store.Store.
func (s *Store) PurgeSandboxes(ctx context.Context, deletedBefore time.Time) (int, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM sandboxes WHERE deleted_at IS NOT NULL AND deleted_at < ?`,
		nanos(deletedBefore))
	if err != nil {
		return 0, fmt.Errorf("purge sandboxes: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}
