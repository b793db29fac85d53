package sqlstore

import (
	"fmt"
	"strings"
)

// A SchemaDialect says how one SQL database spells the column types of
// the schema.
type SchemaDialect struct {
	Name  string
	Int   string // a 64-bit integer
	Bool  string // a flag
	False string // the flag's false, as a DEFAULT
	Bytes string // a byte string
	JSON  string // a JSON document
	// DocBackend reads the backend out of a sandbox's doc.
	DocBackend string
	// After are statements run after the tables are created (storage
	// settings of this database only).
	After []string
}

// The two dialects. The INTEGER columns (charged, drain, exit_code) are
// the same in both: sqlstore binds them with B2i.
var (
	SQLiteSchema = SchemaDialect{Name: "sqlite", Int: "INTEGER", Bool: "INTEGER", False: "0", Bytes: "BLOB", JSON: "TEXT",
		DocBackend: `json_extract(doc, '$.API.backend')`}

	PostgresSchema = SchemaDialect{Name: "postgres", Int: "BIGINT", Bool: "BOOLEAN", False: "FALSE", Bytes: "BYTEA", JSON: "JSONB",
		DocBackend: `doc->'API'->>'backend'`,
		After: []string{
			// Sandboxes come in bursts of thousands; autovacuum's default
			// (10% of the table changed) would leave the planner thinking a
			// tenant has a handful of rows long after it has a hundred
			// thousand, and listing them sorts them all (measured: 117 ms
			// instead of 0.08 ms at 200k).
			`ALTER TABLE sandboxes SET (autovacuum_analyze_scale_factor = 0.01, autovacuum_analyze_threshold = 1000,
		autovacuum_vacuum_scale_factor = 0.05)`,
		}}
)

// schema is the one definition of the control plane's tables, in both
// databases: {int}, {bool}, {false}, {bytes} and {json} are the dialect's.
// Times are Unix nanoseconds. A placed sandbox's resources are charged to
// its node and its tenant until its record ends (charged); nodes carry
// their state, limits and allocation in columns so that a conditional
// UPDATE can reserve.
const schema = `CREATE TABLE tenants (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	created_at {int} NOT NULL
);
CREATE TABLE api_keys (
	id TEXT PRIMARY KEY,
	tenant TEXT NOT NULL REFERENCES tenants(id),
	secret_hash {bytes} NOT NULL,
	admin {bool} NOT NULL,
	created_at {int} NOT NULL
);
CREATE TABLE layers (
	tenant TEXT NOT NULL,
	name TEXT NOT NULL,
	tag TEXT NOT NULL,
	digest TEXT NOT NULL,
	kind TEXT NOT NULL,
	size {int} NOT NULL,
	public {bool} NOT NULL,
	created_at {int} NOT NULL,
	-- a snapshot layer's parent stack: digests, base first, space-separated
	parents TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (tenant, name, tag)
);
CREATE INDEX layers_digest ON layers(digest);
CREATE TABLE sandboxes (
	id TEXT PRIMARY KEY,
	tenant TEXT NOT NULL,
	state TEXT NOT NULL,
	node TEXT NOT NULL,
	expires_at {int},
	deleted_at {int},
	last_active {int} NOT NULL,
	version {int} NOT NULL,
	doc {json} NOT NULL,
	mcpu {int} NOT NULL DEFAULT 0,
	memory_mb {int} NOT NULL DEFAULT 0,
	pids {int} NOT NULL DEFAULT 0,
	charged INTEGER NOT NULL DEFAULT 0,
	-- nanoseconds, 0 for none
	idle_timeout {int} NOT NULL DEFAULT 0,
	disk_mb {int} NOT NULL DEFAULT 0,
	-- the backend (also in doc), as a column so that counts by backend
	-- are an index scan
	backend TEXT NOT NULL DEFAULT ''
);
CREATE INDEX sandboxes_tenant ON sandboxes(tenant, id);
CREATE INDEX sandboxes_node ON sandboxes(node, state);
CREATE INDEX sandboxes_expires ON sandboxes(expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX sandboxes_idle ON sandboxes((last_active + idle_timeout)) WHERE idle_timeout > 0;
CREATE INDEX sandboxes_count ON sandboxes(tenant, state, backend);
CREATE TABLE nodes (
	id TEXT PRIMARY KEY,
	doc {json} NOT NULL,
	state TEXT NOT NULL,
	drain INTEGER NOT NULL DEFAULT 0,
	last_seen {int} NOT NULL DEFAULT 0,
	limit_mcpu {int} NOT NULL DEFAULT 0,
	limit_memory_mb {int} NOT NULL DEFAULT 0,
	limit_pids {int} NOT NULL DEFAULT 0,
	alloc_mcpu {int} NOT NULL DEFAULT 0,
	alloc_memory_mb {int} NOT NULL DEFAULT 0,
	alloc_pids {int} NOT NULL DEFAULT 0,
	sandboxes {int} NOT NULL DEFAULT 0,
	-- 0: the node reports no disk and is not limited by it
	limit_disk_mb {int} NOT NULL DEFAULT 0,
	alloc_disk_mb {int} NOT NULL DEFAULT 0
);
CREATE TABLE tenant_usage (
	tenant TEXT PRIMARY KEY,
	max_sandboxes {int} NOT NULL DEFAULT 0,
	max_mcpu {int} NOT NULL DEFAULT 0,
	max_memory_mb {int} NOT NULL DEFAULT 0,
	sandboxes {int} NOT NULL DEFAULT 0,
	mcpu {int} NOT NULL DEFAULT 0,
	memory_mb {int} NOT NULL DEFAULT 0
);
CREATE TABLE trajectory_steps (
	tenant TEXT NOT NULL,
	trajectory TEXT NOT NULL,
	step {int} NOT NULL,
	fingerprint TEXT NOT NULL,
	attempt TEXT NOT NULL,
	sandbox TEXT NOT NULL,
	generation {int} NOT NULL,
	state TEXT NOT NULL,
	exit_code INTEGER,
	result TEXT,
	started_at {int} NOT NULL,
	recorded_at {int},
	-- how many times the done step was replayed (answered from the log)
	-- and when last
	replays {int} NOT NULL DEFAULT 0,
	replayed_at {int},
	PRIMARY KEY (tenant, trajectory, step)
);
CREATE TABLE trajectories (
	tenant TEXT NOT NULL,
	id TEXT NOT NULL,
	checkpoint_every {int} NOT NULL,
	updated_at {int} NOT NULL,
	PRIMARY KEY (tenant, id)
);
CREATE TABLE trajectory_checkpoints (
	tenant TEXT NOT NULL,
	trajectory TEXT NOT NULL,
	step {int} NOT NULL,
	attempt TEXT NOT NULL,
	layer_name TEXT NOT NULL,
	layer_tag TEXT NOT NULL,
	digest TEXT NOT NULL,
	size {int} NOT NULL,
	sandbox TEXT NOT NULL,
	generation {int} NOT NULL,
	spec TEXT NOT NULL,
	created_at {int} NOT NULL,
	dropped {bool} NOT NULL DEFAULT {false},
	PRIMARY KEY (tenant, trajectory, step, attempt)
);`

// squashedVersion is the version the schema above had when the
// development migrations (five, before any release) were squashed into it.
const squashedVersion = 5

// upgrades take a database from version squashedVersion+i to
// squashedVersion+i+1, written with the schema's {tokens}. A change to the
// schema goes both into schema (new databases) and here (existing ones).
var upgrades = []string{
	// 6: disk_mb is charged to nodes like memory. Sandboxes placed before
	// hold no disk charge (their release returns none).
	`ALTER TABLE sandboxes ADD COLUMN disk_mb {int} NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN limit_disk_mb {int} NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN alloc_disk_mb {int} NOT NULL DEFAULT 0;`,
	// 7: a step says how often it was replayed (the dashboard's timeline
	// and the trajectory API show replayed against run); a sandbox's
	// backend gets a column (from its doc) and sandboxes an index to count
	// them by tenant, state and backend.
	`ALTER TABLE trajectory_steps ADD COLUMN replays {int} NOT NULL DEFAULT 0;
	ALTER TABLE trajectory_steps ADD COLUMN replayed_at {int};
	ALTER TABLE sandboxes ADD COLUMN backend TEXT NOT NULL DEFAULT '';
	UPDATE sandboxes SET backend = COALESCE({docbackend}, '');
	CREATE INDEX sandboxes_count ON sandboxes(tenant, state, backend);`,
}

// SchemaVersion is the version a database has once migrated.
func SchemaVersion() int { return squashedVersion + len(upgrades) }

// Migration returns the statements that take a database of this dialect
// from version v (0: empty) to SchemaVersion(), to run in one
// transaction. A database of a development build from before the squash
// (1 to 4) or of a newer build is refused.
func Migration(d SchemaDialect, v int) ([]string, error) {
	switch {
	case v == 0:
		return append([]string{d.spell(schema)}, d.After...), nil
	case v < squashedVersion:
		return nil, fmt.Errorf("database schema version %d is from a development build before version %d: recreate the database", v, squashedVersion)
	case v > SchemaVersion():
		return nil, fmt.Errorf("database schema version %d is newer than this build's %d", v, SchemaVersion())
	}
	var out []string
	for _, u := range upgrades[v-squashedVersion:] {
		out = append(out, d.spell(u))
	}
	return out, nil
}

// Schema is the whole schema in dialect d.
func Schema(d SchemaDialect) string { return d.spell(schema) }

func (d SchemaDialect) spell(s string) string {
	return strings.NewReplacer("{int}", d.Int, "{bool}", d.Bool, "{false}", d.False, "{bytes}", d.Bytes, "{json}", d.JSON, "{docbackend}", d.DocBackend).Replace(s)
}
