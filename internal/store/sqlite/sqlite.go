// Package sqlite is the embedded control-plane store: one SQLite database
// file in the data directory, through the pure-Go modernc.org/sqlite driver
// (no cgo). Writes go through a single connection, reads through a small
// pool, in WAL mode; the hot writes (sandbox records and their charges) are
// group-committed: concurrent callers' writes share one transaction, each
// in its own savepoint (see writer.go). It must never be shared by two
// server processes; use the PostgreSQL store for several replicas.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/sqlstore"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Store is a store.Store on SQLite.
type Store struct {
	w *sql.DB // one connection: SQLite has one writer
	r *sql.DB
	writer
	// reads are the hot read statements, prepared on r.
	reads map[string]*sql.Stmt
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database at path and migrates it.
func Open(ctx context.Context, path string) (*Store, error) {
	dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)" +
		"&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_txlock=immediate" +
		// After a checkpoint the WAL is cut back to 64 MB: bursts of bulk
		// inserts while readers hold old snapshots would otherwise leave it
		// at its high-water mark.
		"&_pragma=journal_size_limit(67108864)"
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
	r.SetMaxIdleConns(4)
	s := &Store{w: w, r: r}
	if err := s.migrate(ctx); err != nil {
		s.r.Close()
		s.w.Close()
		return nil, err
	}
	if err := s.writer.start(ctx, w, path+"-wal"); err != nil {
		s.Close()
		return nil, err
	}
	s.reads = map[string]*sql.Stmt{}
	for _, q := range []string{sqlstore.SandboxGet, sqlstore.KeyGet, sqlstore.LayerGet} {
		st, err := r.PrepareContext(ctx, q)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("prepare %q: %w", q, err)
		}
		s.reads[q] = st
	}
	return s, nil
}

// readRow runs a hot read.
func (s *Store) readRow(ctx context.Context, q string, args ...any) *sql.Row {
	if st, ok := s.reads[q]; ok {
		return st.QueryRowContext(ctx, args...)
	}
	return s.r.QueryRowContext(ctx, q, args...)
}

// Close waits for pending writes and closes the database.
func (s *Store) Close() error {
	s.writer.stop()
	for _, st := range s.reads {
		st.Close()
	}
	return errors.Join(s.r.Close(), s.w.Close())
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
	stmts, err := sqlstore.Migration(sqlstore.SQLiteSchema, v)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if len(stmts) == 0 {
		return nil
	}
	to := sqlstore.SchemaVersion()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate to %d: %w", to, err)
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate to %d: %w", to, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE schema_version SET version = ?`, to); err != nil {
		tx.Rollback()
		return fmt.Errorf("migrate to %d: %w", to, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate to %d: %w", to, err)
	}
	return nil
}

func isUnique(err error) bool {
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

// CreateTenant implements store.Store.
func (s *Store) CreateTenant(ctx context.Context, t store.Tenant) error {
	_, err := s.w.ExecContext(ctx, sqlstore.TenantInsert, sqlstore.TenantArgs(t)...)
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
	t, err := sqlstore.ScanTenant(s.r.QueryRowContext(ctx, sqlstore.TenantGet, id))
	if errors.Is(err, sql.ErrNoRows) {
		return t, errdefs.NotFound("tenant %s", id)
	}
	if err != nil {
		return t, fmt.Errorf("get tenant: %w", err)
	}
	return t, nil
}

// ListTenants implements store.Store.
func (s *Store) ListTenants(ctx context.Context) ([]store.Tenant, error) {
	rows, err := s.r.QueryContext(ctx, sqlstore.TenantList)
	return collect(rows, err, "list tenants", sqlstore.ScanTenant)
}

// CreateKey implements store.Store.
func (s *Store) CreateKey(ctx context.Context, k store.Key) error {
	_, err := s.w.ExecContext(ctx, sqlstore.KeyInsert, sqlstore.KeyArgs(k)...)
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

// GetKey implements store.Store.
func (s *Store) GetKey(ctx context.Context, id string) (store.Key, error) {
	k, err := sqlstore.ScanKey(s.readRow(ctx, sqlstore.KeyGet, id))
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
	rows, err := s.r.QueryContext(ctx, sqlstore.KeyList, tenant)
	return collect(rows, err, "list keys", sqlstore.ScanKey)
}

// DeleteKey implements store.Store.
func (s *Store) DeleteKey(ctx context.Context, id string) error {
	res, err := s.w.ExecContext(ctx, sqlstore.KeyDelete, id)
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
	if _, err := s.w.ExecContext(ctx, sqlstore.LayerPut, sqlstore.LayerArgs(l)...); err != nil {
		return fmt.Errorf("put layer: %w", err)
	}
	return nil
}

// GetLayer implements store.Store. The tenant's own layer wins over a
// public one of the same name.
func (s *Store) GetLayer(ctx context.Context, tenant, name, tag string) (store.Layer, error) {
	l, err := sqlstore.ScanLayer(s.readRow(ctx, sqlstore.LayerGet, sqlstore.GetLayerArgs(tenant, name, tag)...))
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
	l, err := sqlstore.ScanLayer(s.r.QueryRowContext(ctx, sqlstore.LayerByDigest, sqlstore.LayerByDigestArgs(tenant, digest)...))
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
	rows, err := s.r.QueryContext(ctx, sqlstore.LayerList, tenant)
	return collect(rows, err, "list layers", sqlstore.ScanLayer)
}

// collect reads the rows of a query with scan; what names the query in
// errors.
func collect[T any](rows *sql.Rows, err error, what string, scan func(sqlstore.Scanner) (T, error)) ([]T, error) {
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}
