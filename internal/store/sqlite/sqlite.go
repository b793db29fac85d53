// Package sqlite is the embedded control-plane store: one SQLite database
// file in the data directory, through the pure-Go modernc.org/sqlite driver
// (no cgo). Writes go through a single connection, reads through a small
// pool, in WAL mode. It must never be shared by two server processes; use
// a PostgreSQL store for several replicas.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Store is a store.Store on SQLite.
type Store struct {
	w *sql.DB // one connection: SQLite has one writer
	r *sql.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database at path and migrates it.
func Open(ctx context.Context, path string) (*Store, error) {
	dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)" +
		"&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_txlock=immediate"
	w, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	r, err := sql.Open("sqlite", dsn)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	r.SetMaxOpenConns(4)
	s := &Store{w: w, r: r}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error {
	return errors.Join(s.r.Close(), s.w.Close())
}

var migrations = []string{
	`CREATE TABLE tenants (
		id TEXT PRIMARY KEY,
		name TEXT NOT NULL UNIQUE,
		created_at INTEGER NOT NULL
	);
	CREATE TABLE api_keys (
		id TEXT PRIMARY KEY,
		tenant TEXT NOT NULL REFERENCES tenants(id),
		secret_hash BLOB NOT NULL,
		admin INTEGER NOT NULL,
		created_at INTEGER NOT NULL
	);
	CREATE TABLE layers (
		tenant TEXT NOT NULL,
		name TEXT NOT NULL,
		tag TEXT NOT NULL,
		digest TEXT NOT NULL,
		kind TEXT NOT NULL,
		size INTEGER NOT NULL,
		public INTEGER NOT NULL,
		created_at INTEGER NOT NULL,
		PRIMARY KEY (tenant, name, tag)
	);
	CREATE INDEX layers_digest ON layers(digest);
	CREATE TABLE sandboxes (
		id TEXT PRIMARY KEY,
		tenant TEXT NOT NULL,
		state TEXT NOT NULL,
		node TEXT NOT NULL,
		expires_at INTEGER,
		deleted_at INTEGER,
		last_active INTEGER NOT NULL,
		version INTEGER NOT NULL,
		doc TEXT NOT NULL
	);
	CREATE INDEX sandboxes_tenant ON sandboxes(tenant, id);
	CREATE INDEX sandboxes_node ON sandboxes(node, state);
	CREATE INDEX sandboxes_expires ON sandboxes(expires_at) WHERE expires_at IS NOT NULL;
	CREATE TABLE nodes (
		id TEXT PRIMARY KEY,
		doc TEXT NOT NULL
	);`,
	// 2: idle timeouts (nanoseconds, 0 for none) and the trajectory log.
	`ALTER TABLE sandboxes ADD COLUMN idle_timeout INTEGER NOT NULL DEFAULT 0;
	CREATE INDEX sandboxes_idle ON sandboxes((last_active + idle_timeout)) WHERE idle_timeout > 0;
	CREATE TABLE trajectory_steps (
		tenant TEXT NOT NULL,
		trajectory TEXT NOT NULL,
		step INTEGER NOT NULL,
		fingerprint TEXT NOT NULL,
		attempt TEXT NOT NULL,
		sandbox TEXT NOT NULL,
		generation INTEGER NOT NULL,
		state TEXT NOT NULL,
		exit_code INTEGER,
		result TEXT,
		started_at INTEGER NOT NULL,
		recorded_at INTEGER,
		PRIMARY KEY (tenant, trajectory, step)
	);`,
	// 3: a snapshot layer's parent stack: digests, base first, space-separated.
	`ALTER TABLE layers ADD COLUMN parents TEXT NOT NULL DEFAULT '';`,
}

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	var v int
	err := s.w.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		if _, err := s.w.ExecContext(ctx, `INSERT INTO schema_version VALUES (0)`); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("migrate: read version: %w", err)
	}
	for i := v; i < len(migrations); i++ {
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("migrate to %d: %w", i+1, err)
		}
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate to %d: %w", i+1, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE schema_version SET version = ?`, i+1); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate to %d: %w", i+1, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migrate to %d: %w", i+1, err)
		}
	}
	return nil
}

func nanos(t time.Time) int64 { return t.UnixNano() }

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

func isUnique(err error) bool {
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

// CreateTenant implements store.Store.
func (s *Store) CreateTenant(ctx context.Context, t store.Tenant) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO tenants (id, name, created_at) VALUES (?, ?, ?)`,
		t.ID, t.Name, nanos(t.CreatedAt))
	if isUnique(err) {
		return fmt.Errorf("tenant %q: %w", t.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create tenant: %w", err)
	}
	return nil
}

// GetTenant implements store.Store.
func (s *Store) GetTenant(ctx context.Context, id string) (store.Tenant, error) {
	var t store.Tenant
	var created int64
	err := s.r.QueryRowContext(ctx, `SELECT id, name, created_at FROM tenants WHERE id = ?`, id).
		Scan(&t.ID, &t.Name, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return t, errdefs.NotFound("tenant %s", id)
	}
	if err != nil {
		return t, fmt.Errorf("get tenant: %w", err)
	}
	t.CreatedAt = fromNanos(created)
	return t, nil
}

// ListTenants implements store.Store.
func (s *Store) ListTenants(ctx context.Context) ([]store.Tenant, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, name, created_at FROM tenants ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	defer rows.Close()
	var out []store.Tenant
	for rows.Next() {
		var t store.Tenant
		var created int64
		if err := rows.Scan(&t.ID, &t.Name, &created); err != nil {
			return nil, fmt.Errorf("list tenants: %w", err)
		}
		t.CreatedAt = fromNanos(created)
		out = append(out, t)
	}
	return out, rows.Err()
}

// CreateKey implements store.Store.
func (s *Store) CreateKey(ctx context.Context, k store.Key) error {
	_, err := s.w.ExecContext(ctx,
		`INSERT INTO api_keys (id, tenant, secret_hash, admin, created_at) VALUES (?, ?, ?, ?, ?)`,
		k.ID, k.Tenant, k.SecretHash, k.Admin, nanos(k.CreatedAt))
	if isUnique(err) {
		return fmt.Errorf("key %s: %w", k.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil && strings.Contains(err.Error(), "FOREIGN KEY") {
		return errdefs.NotFound("tenant %s", k.Tenant)
	}
	if err != nil {
		return fmt.Errorf("create key: %w", err)
	}
	return nil
}

const keyCols = `id, tenant, secret_hash, admin, created_at`

func scanKey(sc interface{ Scan(...any) error }) (store.Key, error) {
	var k store.Key
	var created int64
	err := sc.Scan(&k.ID, &k.Tenant, &k.SecretHash, &k.Admin, &created)
	k.CreatedAt = fromNanos(created)
	return k, err
}

// GetKey implements store.Store.
func (s *Store) GetKey(ctx context.Context, id string) (store.Key, error) {
	k, err := scanKey(s.r.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return k, errdefs.NotFound("key %s", id)
	}
	if err != nil {
		return k, fmt.Errorf("get key: %w", err)
	}
	return k, nil
}

// ListKeys implements store.Store.
func (s *Store) ListKeys(ctx context.Context, tenant string) ([]store.Key, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE tenant = ? ORDER BY created_at`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	defer rows.Close()
	var out []store.Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// DeleteKey implements store.Store.
func (s *Store) DeleteKey(ctx context.Context, id string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM api_keys WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("key %s", id)
	}
	return nil
}

// PutLayer implements store.Store.
func (s *Store) PutLayer(ctx context.Context, l store.Layer) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO layers (tenant, name, tag, digest, kind, size, public, created_at, parents)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (tenant, name, tag) DO UPDATE SET digest = excluded.digest, kind = excluded.kind,
			size = excluded.size, public = excluded.public, created_at = excluded.created_at,
			parents = excluded.parents`,
		l.Tenant, l.Name, l.Tag, l.Digest, l.Kind, l.Size, l.Public, nanos(l.CreatedAt), strings.Join(l.Parents, " "))
	if err != nil {
		return fmt.Errorf("put layer: %w", err)
	}
	return nil
}

const layerCols = `tenant, name, tag, digest, kind, size, public, created_at, parents`

func scanLayer(sc interface{ Scan(...any) error }) (store.Layer, error) {
	var l store.Layer
	var created int64
	var parents string
	err := sc.Scan(&l.Tenant, &l.Name, &l.Tag, &l.Digest, &l.Kind, &l.Size, &l.Public, &created, &parents)
	l.CreatedAt = fromNanos(created)
	l.Parents = strings.Fields(parents)
	return l, err
}

// GetLayer implements store.Store. The tenant's own layer wins over a
// public one of the same name.
func (s *Store) GetLayer(ctx context.Context, tenant, name, tag string) (store.Layer, error) {
	l, err := scanLayer(s.r.QueryRowContext(ctx, `SELECT `+layerCols+` FROM layers
		WHERE name = ? AND tag = ? AND (tenant = ? OR public)
		ORDER BY tenant = ? DESC LIMIT 1`, name, tag, tenant, tenant))
	if errors.Is(err, sql.ErrNoRows) {
		return l, errdefs.NotFound("layer %s:%s", name, tag)
	}
	if err != nil {
		return l, fmt.Errorf("get layer: %w", err)
	}
	return l, nil
}

// LayerByDigest implements store.Store.
func (s *Store) LayerByDigest(ctx context.Context, tenant, digest string) (store.Layer, error) {
	l, err := scanLayer(s.r.QueryRowContext(ctx, `SELECT `+layerCols+` FROM layers
		WHERE digest = ? AND (tenant = ? OR public)
		ORDER BY tenant = ? DESC, created_at DESC LIMIT 1`, digest, tenant, tenant))
	if errors.Is(err, sql.ErrNoRows) {
		return l, errdefs.NotFound("layer %s", digest)
	}
	if err != nil {
		return l, fmt.Errorf("get layer: %w", err)
	}
	return l, nil
}

// ListLayers implements store.Store.
func (s *Store) ListLayers(ctx context.Context, tenant string) ([]store.Layer, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+layerCols+` FROM layers
		WHERE tenant = ? OR public ORDER BY name, tag`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	defer rows.Close()
	var out []store.Layer
	for rows.Next() {
		l, err := scanLayer(rows)
		if err != nil {
			return nil, fmt.Errorf("list layers: %w", err)
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

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
	idle := sb.API.IdleTimeoutSeconds * int64(time.Second)
	return []any{sb.Tenant, sb.API.State, sb.API.Node, expires, deleted, nanos(sb.LastActive), idle, string(doc), sb.API.ID}, nil
}

// insertSandbox takes sandboxArgs.
const insertSandbox = `INSERT INTO sandboxes (tenant, state, node, expires_at, deleted_at,
	last_active, idle_timeout, doc, id, version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1)`

// CreateSandbox implements store.Store.
func (s *Store) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	_, err = s.w.ExecContext(ctx, insertSandbox, args...)
	if isUnique(err) {
		return fmt.Errorf("sandbox %s: %w", sb.API.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	sb.Version = 1
	return nil
}

// CreateSandboxes implements store.Store: one transaction, one prepared
// statement.
func (s *Store) CreateSandboxes(ctx context.Context, list []*store.Sandbox) error {
	if len(list) == 0 {
		return nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create sandboxes: %w", err)
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, insertSandbox)
	if err != nil {
		return fmt.Errorf("create sandboxes: %w", err)
	}
	defer stmt.Close()
	for _, sb := range list {
		args, err := sandboxArgs(sb)
		if err != nil {
			return err
		}
		if _, err := stmt.ExecContext(ctx, args...); err != nil {
			if isUnique(err) {
				return fmt.Errorf("sandbox %s: %w", sb.API.ID, errdefs.ErrAlreadyExists)
			}
			return fmt.Errorf("create sandboxes: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create sandboxes: %w", err)
	}
	for _, sb := range list {
		sb.Version = 1
	}
	return nil
}

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := scanSandbox(s.r.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Sandbox{}, errdefs.NotFound("sandbox %s", id)
	}
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("get sandbox: %w", err)
	}
	return sb, nil
}

const sandboxCols = `doc, last_active, version`

func scanSandbox(sc interface{ Scan(...any) error }) (store.Sandbox, error) {
	var sb store.Sandbox
	var doc string
	var active int64
	if err := sc.Scan(&doc, &active, &sb.Version); err != nil {
		return sb, err
	}
	if err := json.Unmarshal([]byte(doc), &sb); err != nil {
		return sb, fmt.Errorf("decode sandbox: %w", err)
	}
	sb.LastActive = fromNanos(active)
	return sb, nil
}

// UpdateSandbox implements store.Store.
func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	res, err := s.w.ExecContext(ctx, `UPDATE sandboxes SET tenant = ?, state = ?, node = ?, expires_at = ?,
		deleted_at = ?, last_active = ?, idle_timeout = ?, doc = ?, version = version + 1 WHERE id = ? AND version = ?`,
		append(args, sb.Version)...)
	if err != nil {
		return fmt.Errorf("update sandbox: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		sb.Version++
		return nil
	}
	var exists bool
	if err := s.w.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)`, sb.API.ID).Scan(&exists); err != nil {
		return fmt.Errorf("update sandbox: %w", err)
	}
	if !exists {
		return errdefs.NotFound("sandbox %s", sb.API.ID)
	}
	return fmt.Errorf("update sandbox %s: %w", sb.API.ID, store.ErrConflict)
}

// TouchSandbox implements store.Store.
func (s *Store) TouchSandbox(ctx context.Context, id string, t time.Time) error {
	if _, err := s.w.ExecContext(ctx, `UPDATE sandboxes SET last_active = ? WHERE id = ?`, nanos(t), id); err != nil {
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

// UpsertNode implements store.Store.
func (s *Store) UpsertNode(ctx context.Context, n store.Node) error {
	doc, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("encode node: %w", err)
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO nodes (id, doc) VALUES (?, ?)
		ON CONFLICT (id) DO UPDATE SET doc = excluded.doc`, n.ID, string(doc))
	if err != nil {
		return fmt.Errorf("upsert node: %w", err)
	}
	return nil
}

// ListNodes implements store.Store.
func (s *Store) ListNodes(ctx context.Context) ([]store.Node, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT doc FROM nodes ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	var out []store.Node
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		var n store.Node
		if err := json.Unmarshal([]byte(doc), &n); err != nil {
			return nil, fmt.Errorf("decode node: %w", err)
		}
		out = append(out, n)
	}
	return out, rows.Err()
}
