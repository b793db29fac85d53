// Package postgres is the control-plane store on PostgreSQL (through pgx
// v5), for running several `dsec server` replicas over one cluster. The
// replicas share nothing but this database: every reservation is a
// conditional UPDATE of a node's (and a tenant's) counters in the same
// transaction as the sandbox's insert, so that concurrent placements by
// different replicas never overcommit a node nor place one sandbox twice.
// The SQL stays close to the SQLite store's (plain tables, upserts,
// RETURNING-free counters); it must never rely on anything but
// transactions at READ COMMITTED and row locks.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/sqlstore"
)

// Store is a store.Store on PostgreSQL.
type Store struct {
	pool *pgxpool.Pool
	batcher
}

var _ store.Store = (*Store)(nil)

// Open connects to the database at dsn (a postgres:// URL or a key=value
// string) and migrates it. Several processes may open one database at
// once.
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		// Commits wait for the WAL to reach disk; PostgreSQL flushes the
		// commits of all waiting connections at once, so more of them in
		// flight is more commits per flush.
		cfg.MaxConns = 64
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	s := &Store{pool: pool}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	s.batcher.start(pool)
	return s, nil
}

// Close waits for queued writes and closes the connections.
func (s *Store) Close() error {
	s.batcher.stop()
	s.pool.Close()
	return nil
}

// migrationLock is the advisory lock key that serializes replicas
// migrating one database at once.
const migrationLock = 0x64736563 // "dsec"

func (s *Store) migrate(ctx context.Context) error {
	return s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
			return fmt.Errorf("migrate: lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		var v int
		err := tx.QueryRow(ctx, `SELECT version FROM schema_version`).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			if _, err := tx.Exec(ctx, `INSERT INTO schema_version VALUES (0)`); err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
		} else if err != nil {
			return fmt.Errorf("migrate: read version: %w", err)
		}
		stmts, err := sqlstore.Migration(sqlstore.PostgresSchema, v)
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("migrate to %d: %w", sqlstore.SchemaVersion(), err)
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE schema_version SET version = $1`, sqlstore.SchemaVersion()); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		return nil
	})
}

// tx runs fn in a transaction, again if PostgreSQL aborted it for a
// deadlock or a serialization failure.
func (s *Store) tx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := pgx.BeginFunc(ctx, s.pool, fn)
		var pe *pgconn.PgError
		if attempt < 5 && errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01") {
			time.Sleep(time.Duration(attempt+1) * time.Millisecond)
			continue
		}
		return err
	}
}

// rebind turns ? placeholders into $1, $2, … (the statements are written
// as for SQLite).
func rebind(q string) string {
	var b strings.Builder
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}

// The shared statements, rebound once.
var (
	tenantInsert            = rebind(sqlstore.TenantInsert)
	tenantGet               = rebind(sqlstore.TenantGet)
	keyInsert               = rebind(sqlstore.KeyInsert)
	keyGet                  = rebind(sqlstore.KeyGet)
	keyList                 = rebind(sqlstore.KeyList)
	keyDelete               = rebind(sqlstore.KeyDelete)
	layerPut                = rebind(sqlstore.LayerPut)
	layerGet                = rebind(sqlstore.LayerGet)
	layerByDigest           = rebind(sqlstore.LayerByDigest)
	layerList               = rebind(sqlstore.LayerList)
	layerDelete             = rebind(sqlstore.LayerDelete)
	quotaSet                = rebind(sqlstore.QuotaSet)
	usageGet                = rebind(sqlstore.UsageGet)
	nodeGet                 = rebind(sqlstore.NodeGet)
	nodeDrain               = rebind(sqlstore.NodeDrain)
	sandboxInsert           = rebind(sqlstore.SandboxInsert)
	sandboxUpdate           = rebind(sqlstore.SandboxUpdate)
	sandboxUpdateLive       = rebind(sqlstore.SandboxUpdateLive)
	sandboxGet              = rebind(sqlstore.SandboxGet)
	sandboxTouch            = rebind(sqlstore.SandboxTouch)
	sandboxPurge            = rebind(sqlstore.SandboxPurge)
	storedGet               = rebind(sqlstore.StoredGet + ` FOR UPDATE`)
	nodeCharge              = rebind(sqlstore.NodeCharge)
	nodeRelease             = rebind(sqlstore.NodeRelease)
	tenantCharge            = rebind(sqlstore.TenantCharge)
	tenantRelease           = rebind(sqlstore.TenantRelease)
	stepGet                 = rebind(sqlstore.StepGet)
	stepList                = rebind(sqlstore.StepList)
	stepInsert              = rebind(sqlstore.StepInsert)
	stepFinish              = rebind(sqlstore.StepFinish)
	stepsDelete             = rebind(sqlstore.StepsDelete)
	stepReplayed            = rebind(sqlstore.StepReplayed)
	stepsMove               = rebind(sqlstore.StepsMove)
	trajectoriesPurge       = rebind(sqlstore.TrajectoriesPurge)
	trajectorySettingsPurge = rebind(sqlstore.TrajectorySettingsPurge)
	trajectoryPut           = rebind(sqlstore.TrajectoryPut)
	trajectoryGet           = rebind(sqlstore.TrajectoryGet)
	checkpointInsert        = rebind(sqlstore.CheckpointInsert)
	checkpointList          = rebind(sqlstore.CheckpointList)
	checkpointsDead         = rebind(sqlstore.CheckpointsDead)
	checkpointDrop          = rebind(sqlstore.CheckpointDrop)
	checkpointDelete        = rebind(sqlstore.CheckpointDelete)
)

// sandboxesLost is sqlstore.SandboxesLost taking its rows' locks in id
// order first, the order a group of live updates takes them in
// (batcher.go).
const sandboxesLost = `UPDATE sandboxes SET state = 'lost', version = version + 1 WHERE id IN (
	SELECT id FROM sandboxes WHERE node = $1 AND state IN ('creating', 'running', 'paused') ORDER BY id FOR UPDATE)`

func code(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func isUnique(err error) bool     { return code(err) == "23505" }
func isForeignKey(err error) bool { return code(err) == "23503" }

// collect reads the rows of a query with scan; what names the query in
// errors.
func collect[T any](rows pgx.Rows, err error, what string, scan func(sqlstore.Scanner) (T, error)) ([]T, error) {
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (T, error) { return scan(r) })
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// CreateTenant implements store.Store.
func (s *Store) CreateTenant(ctx context.Context, t store.Tenant) error {
	_, err := s.pool.Exec(ctx, tenantInsert, sqlstore.TenantArgs(t)...)
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
	t, err := sqlstore.ScanTenant(s.pool.QueryRow(ctx, tenantGet, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return t, errdefs.NotFound("tenant %s", id)
	}
	if err != nil {
		return t, fmt.Errorf("get tenant: %w", err)
	}
	return t, nil
}

// ListTenants implements store.Store.
func (s *Store) ListTenants(ctx context.Context) ([]store.Tenant, error) {
	rows, err := s.pool.Query(ctx, sqlstore.TenantList)
	return collect(rows, err, "list tenants", sqlstore.ScanTenant)
}

// CreateKey implements store.Store.
func (s *Store) CreateKey(ctx context.Context, k store.Key) error {
	_, err := s.pool.Exec(ctx, keyInsert, sqlstore.KeyArgs(k)...)
	switch {
	case isUnique(err):
		return fmt.Errorf("key %s: %w", k.ID, errdefs.ErrAlreadyExists)
	case isForeignKey(err):
		return errdefs.NotFound("tenant %s", k.Tenant)
	case err != nil:
		return fmt.Errorf("create key: %w", err)
	}
	return nil
}

// GetKey implements store.Store.
func (s *Store) GetKey(ctx context.Context, id string) (store.Key, error) {
	k, err := sqlstore.ScanKey(s.pool.QueryRow(ctx, keyGet, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return k, errdefs.NotFound("key %s", id)
	}
	if err != nil {
		return k, fmt.Errorf("get key: %w", err)
	}
	return k, nil
}

// ListKeys implements store.Store.
func (s *Store) ListKeys(ctx context.Context, tenant string) ([]store.Key, error) {
	rows, err := s.pool.Query(ctx, keyList, tenant)
	return collect(rows, err, "list keys", sqlstore.ScanKey)
}

// DeleteKey implements store.Store.
func (s *Store) DeleteKey(ctx context.Context, id string) error {
	tag, err := s.pool.Exec(ctx, keyDelete, id)
	if err != nil {
		return fmt.Errorf("delete key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errdefs.NotFound("key %s", id)
	}
	return nil
}

// PutLayer implements store.Store.
func (s *Store) PutLayer(ctx context.Context, l store.Layer) error {
	if _, err := s.pool.Exec(ctx, layerPut, sqlstore.LayerArgs(l)...); err != nil {
		return fmt.Errorf("put layer: %w", err)
	}
	return nil
}

// GetLayer implements store.Store. The tenant's own layer wins over a
// public one of the same name.
func (s *Store) GetLayer(ctx context.Context, tenant, name, tag string) (store.Layer, error) {
	l, err := sqlstore.ScanLayer(s.pool.QueryRow(ctx, layerGet, sqlstore.GetLayerArgs(tenant, name, tag)...))
	if errors.Is(err, pgx.ErrNoRows) {
		return l, errdefs.NotFound("layer %s:%s", name, tag)
	}
	if err != nil {
		return l, fmt.Errorf("get layer: %w", err)
	}
	return l, nil
}

// LayerByDigest implements store.Store.
func (s *Store) LayerByDigest(ctx context.Context, tenant, digest string) (store.Layer, error) {
	l, err := sqlstore.ScanLayer(s.pool.QueryRow(ctx, layerByDigest, sqlstore.LayerByDigestArgs(tenant, digest)...))
	if errors.Is(err, pgx.ErrNoRows) {
		return l, errdefs.NotFound("layer %s", digest)
	}
	if err != nil {
		return l, fmt.Errorf("get layer: %w", err)
	}
	return l, nil
}

// ListLayers implements store.Store.
func (s *Store) ListLayers(ctx context.Context, tenant string) ([]store.Layer, error) {
	rows, err := s.pool.Query(ctx, layerList, tenant)
	return collect(rows, err, "list layers", sqlstore.ScanLayer)
}
