package postgres

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

var (
	sandboxInsert = rebind(`INSERT INTO sandboxes (tenant, state, node, expires_at, deleted_at, last_active, doc,
	mcpu, memory_mb, pids, idle_timeout, id, version, charged) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)`)
	sandboxUpdate = rebind(`UPDATE sandboxes SET tenant = ?, state = ?, node = ?, expires_at = ?, deleted_at = ?,
	last_active = ?, doc = ?, mcpu = ?, memory_mb = ?, pids = ?, idle_timeout = ?, charged = ?, version = version + 1
	WHERE id = ? AND version = ?`)
	nodeCharge = rebind(`UPDATE nodes SET alloc_mcpu = alloc_mcpu + ?, alloc_memory_mb = alloc_memory_mb + ?,
		alloc_pids = alloc_pids + ?, sandboxes = sandboxes + ?
	WHERE id = ? AND state = 'up' AND drain = 0 AND alloc_memory_mb + ? <= limit_memory_mb
		AND (limit_mcpu = 0 OR alloc_mcpu + ? <= limit_mcpu) AND (limit_pids = 0 OR alloc_pids + ? <= limit_pids)`)
	nodeRelease = rebind(`UPDATE nodes SET alloc_mcpu = alloc_mcpu - ?, alloc_memory_mb = alloc_memory_mb - ?,
		alloc_pids = alloc_pids - ?, sandboxes = sandboxes - ? WHERE id = ?`)
	tenantCharge = rebind(`INSERT INTO tenant_usage (tenant, sandboxes, mcpu, memory_mb) VALUES (?, ?, ?, ?)
	ON CONFLICT (tenant) DO UPDATE SET sandboxes = tenant_usage.sandboxes + excluded.sandboxes,
		mcpu = tenant_usage.mcpu + excluded.mcpu, memory_mb = tenant_usage.memory_mb + excluded.memory_mb
	WHERE (tenant_usage.max_sandboxes = 0 OR tenant_usage.sandboxes + excluded.sandboxes <= tenant_usage.max_sandboxes)
		AND (tenant_usage.max_mcpu = 0 OR tenant_usage.mcpu + excluded.mcpu <= tenant_usage.max_mcpu)
		AND (tenant_usage.max_memory_mb = 0 OR tenant_usage.memory_mb + excluded.memory_mb <= tenant_usage.max_memory_mb)`)
	tenantRelease = rebind(`UPDATE tenant_usage SET sandboxes = sandboxes - ?, mcpu = mcpu - ?, memory_mb = memory_mb - ?
	WHERE tenant = ?`)
)

// sandboxArgs are the column values of a record, in sandboxInsert's order
// (without version and charged): args[10] is the idle timeout, args[11]
// the id.
func sandboxArgs(sb *store.Sandbox) ([]any, error) {
	doc, err := json.Marshal(sb)
	if err != nil {
		return nil, fmt.Errorf("encode sandbox: %w", err)
	}
	var expires, deleted *int64
	if sb.API.ExpiresAt != nil {
		v := nanos(*sb.API.ExpiresAt)
		expires = &v
	}
	if sb.DeletedAt != nil {
		v := nanos(*sb.DeletedAt)
		deleted = &v
	}
	r := sb.API.Resources
	idle := sb.API.IdleTimeoutSeconds * int64(time.Second)
	return []any{sb.Tenant, sb.API.State, sb.API.Node, expires, deleted, nanos(sb.LastActive), string(doc),
		store.MilliCPU(r.CPU), r.MemoryMB, r.Pids, idle, sb.API.ID}, nil
}

// CreateSandbox implements store.Store.
func (s *Store) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, sandboxInsert, append(args, 0)...)
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
		args, err := sandboxArgs(sb)
		if err != nil {
			return err
		}
		b.Queue(sandboxInsert, append(args, 0)...)
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

// totals sums charges by key, keys sorted: every transaction locks node
// and tenant rows in one order, so two never deadlock.
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

// PlaceSandboxes implements store.Store. The charges and inserts go to
// the server in one pipelined batch, inside a group transaction (see
// batcher.go).
func (s *Store) PlaceSandboxes(ctx context.Context, sbs []*store.Sandbox) error {
	if len(sbs) == 0 {
		return nil
	}
	nodes := sum(sbs, func(sb *store.Sandbox) string { return sb.API.Node })
	tenants := sum(sbs, func(sb *store.Sandbox) string { return sb.Tenant })
	inserts := make([][]any, 0, len(sbs))
	for _, sb := range sbs {
		args, err := sandboxArgs(sb)
		if err != nil {
			return err
		}
		inserts = append(inserts, append(args, 1))
	}
	err := s.batcher.place(ctx, &placeOp{sbs: sbs, queue: func(b *pgx.Batch) ([]string, []string, error) {
		for _, id := range nodes.keys {
			c := nodes.by[id]
			b.Queue(nodeCharge, c.MilliCPU, c.MemoryMB, c.Pids, c.Sandboxes, id, c.MemoryMB, c.MilliCPU, c.Pids)
		}
		for _, id := range tenants.keys {
			c := tenants.by[id]
			b.Queue(tenantCharge, id, c.Sandboxes, c.MilliCPU, c.MemoryMB)
		}
		for _, args := range inserts {
			b.Queue(sandboxInsert, args...)
		}
		return nodes.keys, tenants.keys, nil
	}})
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		sb.Version = 1
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

// readStored reads a record's charge and locks its row.
func readStored(ctx context.Context, tx pgx.Tx, id string) (stored, error) {
	var st stored
	var charged int
	err := tx.QueryRow(ctx, `SELECT version, charged, node, tenant, mcpu, memory_mb, pids FROM sandboxes WHERE id = $1 FOR UPDATE`, id).
		Scan(&st.version, &charged, &st.node, &st.tenant, &st.charge.MilliCPU, &st.charge.MemoryMB, &st.charge.Pids)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, errdefs.NotFound("sandbox %s", id)
	}
	if err != nil {
		return st, fmt.Errorf("read sandbox %s: %w", id, err)
	}
	st.charged, st.charge.Sandboxes = charged == 1, 1
	return st, nil
}

func release(ctx context.Context, tx pgx.Tx, node, tenant string, c store.Charge) error {
	if _, err := tx.Exec(ctx, nodeRelease, c.MilliCPU, c.MemoryMB, c.Pids, 1, node); err != nil {
		return fmt.Errorf("release node %s: %w", node, err)
	}
	if _, err := tx.Exec(ctx, tenantRelease, 1, c.MilliCPU, c.MemoryMB, tenant); err != nil {
		return fmt.Errorf("release tenant %s: %w", tenant, err)
	}
	return nil
}

// sandboxUpdateLive is UpdateSandbox's one-statement path (one round
// trip, no explicit transaction) for the common update, one that ends
// nothing (DeletedAt stays nil) of a live record: its charge, node and
// tenant stay as they are.
var sandboxUpdateLive = rebind(`UPDATE sandboxes SET state = ?, expires_at = ?, last_active = ?, doc = ?, idle_timeout = ?, version = version + 1
	WHERE id = ? AND version = ? AND node = ? AND tenant = ? AND deleted_at IS NULL`)

// UpdateSandbox implements store.Store.
func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	if sb.DeletedAt == nil {
		n, err := s.batcher.update(ctx, []any{args[1], args[3], args[5], args[6], args[10], sb.API.ID, sb.Version, sb.API.Node, sb.Tenant})
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
		if st.version != sb.Version {
			return fmt.Errorf("update sandbox %s: %w", sb.API.ID, store.ErrConflict)
		}
		charged := st.charged
		if charged {
			if sb.API.Node != st.node || sb.Tenant != st.tenant {
				return errdefs.Invalid("sandbox %s: a charged record changes node only through MoveSandbox", sb.API.ID)
			}
			args[7], args[8], args[9] = st.charge.MilliCPU, st.charge.MemoryMB, st.charge.Pids
			if sb.DeletedAt != nil {
				if err := release(ctx, tx, st.node, st.tenant, st.charge); err != nil {
					return err
				}
				charged = false
			}
		}
		tag, err := tx.Exec(ctx, sandboxUpdate, append(args[:11:11], b2i(charged), sb.API.ID, sb.Version)...)
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

// MoveSandbox implements store.Store.
func (s *Store) MoveSandbox(ctx context.Context, sb *store.Sandbox, node string) error {
	moved := *sb
	moved.API.Node = node
	args, err := sandboxArgs(&moved)
	if err != nil {
		return err
	}
	c := store.ChargeOf(sb.API.Resources)
	err = s.tx(ctx, func(tx pgx.Tx) error {
		st, err := readStored(ctx, tx, sb.API.ID)
		if err != nil {
			return err
		}
		if st.version != sb.Version {
			return fmt.Errorf("move sandbox %s: %w", sb.API.ID, store.ErrConflict)
		}
		if !st.charged {
			return fmt.Errorf("move sandbox %s: it holds no charge: %w", sb.API.ID, errdefs.ErrFailedPrecondition)
		}
		c = st.charge
		// Lock the two node rows in id order.
		charge := func() error {
			tag, err := tx.Exec(ctx, nodeCharge, c.MilliCPU, c.MemoryMB, c.Pids, 1, node, c.MemoryMB, c.MilliCPU, c.Pids)
			if err != nil {
				return fmt.Errorf("charge node %s: %w", node, err)
			}
			if tag.RowsAffected() != 1 {
				return &store.PlaceError{Node: node, Err: store.ErrNodeFull}
			}
			return nil
		}
		releaseOld := func() error {
			_, err := tx.Exec(ctx, nodeRelease, c.MilliCPU, c.MemoryMB, c.Pids, 1, st.node)
			return err
		}
		steps := []func() error{releaseOld, charge}
		if node < st.node {
			steps = []func() error{charge, releaseOld}
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return err
			}
		}
		args[7], args[8], args[9] = c.MilliCPU, c.MemoryMB, c.Pids
		_, err = tx.Exec(ctx, sandboxUpdate, append(args[:11:11], 1, sb.API.ID, sb.Version)...)
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
	tag, err := s.pool.Exec(ctx, `UPDATE sandboxes SET state = 'lost', version = version + 1
		WHERE node = $1 AND state IN ('creating', 'running', 'paused')`, node)
	if err != nil {
		return 0, fmt.Errorf("mark sandboxes of node %s lost: %w", node, err)
	}
	return int(tag.RowsAffected()), nil
}

// sandboxCols: the state column is authoritative (MarkSandboxesLost sets
// it without rewriting the document).
const sandboxCols = `doc, last_active, version, state`

func scanSandbox(r pgx.Row) (store.Sandbox, error) {
	var sb store.Sandbox
	var doc []byte
	var active int64
	var state string
	if err := r.Scan(&doc, &active, &sb.Version, &state); err != nil {
		return sb, err
	}
	if err := json.Unmarshal(doc, &sb); err != nil {
		return sb, fmt.Errorf("decode sandbox: %w", err)
	}
	sb.API.State = state
	sb.LastActive = fromNanos(active)
	return sb, nil
}

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := scanSandbox(s.pool.QueryRow(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = $1`, id))
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
	if _, err := s.pool.Exec(ctx, `UPDATE sandboxes SET last_active = $1 WHERE id = $2`, nanos(t), id); err != nil {
		return fmt.Errorf("touch sandbox: %w", err)
	}
	return nil
}

var labelKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)

// ListSandboxes implements store.Store. Pages are in id order; the page
// token is the last id of the previous page.
func (s *Store) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, string, error) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if !f.AllTenants {
		where = append(where, "tenant = "+arg(f.Tenant))
	}
	if f.Node != "" {
		where = append(where, "node = "+arg(f.Node))
	}
	if len(f.States) > 0 {
		where = append(where, "state = ANY("+arg(f.States)+")")
	}
	for k, v := range f.Labels {
		if !labelKey.MatchString(k) {
			return nil, "", errdefs.Invalid("label key %q", k)
		}
		where = append(where, "doc->'API'->'labels'->>"+arg(k)+" = "+arg(v))
	}
	if f.ExpiredBy != nil {
		where = append(where, "expires_at IS NOT NULL AND expires_at <= "+arg(nanos(*f.ExpiredBy)))
	}
	if f.IdleBy != nil {
		where = append(where, "idle_timeout > 0 AND (last_active + idle_timeout) <= "+arg(nanos(*f.IdleBy)))
	}
	if f.PageToken != "" {
		after, err := base64.RawURLEncoding.DecodeString(f.PageToken)
		if err != nil {
			return nil, "", errdefs.Invalid("bad page token")
		}
		where = append(where, "id > "+arg(string(after)))
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id"
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit+1)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list sandboxes: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Sandbox, error) { return scanSandbox(r) })
	if err != nil {
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
	tag, err := s.pool.Exec(ctx, `DELETE FROM sandboxes WHERE deleted_at IS NOT NULL AND deleted_at < $1`, nanos(deletedBefore))
	if err != nil {
		return 0, fmt.Errorf("purge sandboxes: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
