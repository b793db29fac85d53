// Package sqlstore holds what the two SQL stores, sqlite and postgres,
// share because their logic is the same: the statements whose conditions
// carry the stores' invariants (charges that never pass a node's limit or
// a tenant's quota, optimistic versions, live checkpoints), written with ?
// placeholders (postgres rebinds them); the column lists; how a record
// becomes column values and a row becomes a record; and how a sandbox
// filter becomes a WHERE clause. It must never open a connection, run a
// statement or know a driver: connections, transactions, group commits
// and the mapping of driver errors stay in each store. The schema is
// written once here (schema.go), in each database's spelling of its types.
//
// Flags are bound as Go bools (SQLite keeps them as 0 and 1) except in
// the INTEGER columns both schemas share (charged, drain), bound with B2i.
package sqlstore

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/store"
)

// Scanner is a row: *sql.Row, *sql.Rows, pgx.Row and pgx.CollectableRow
// all are.
type Scanner interface {
	Scan(dest ...any) error
}

// Nanos is how the stores keep times: integer nanoseconds since the epoch.
func Nanos(t time.Time) int64 { return t.UnixNano() }

// FromNanos reads a time kept by Nanos, in UTC.
func FromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// B2i is a flag as stored in an INTEGER column.
func B2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Tenants.
const (
	TenantInsert = `INSERT INTO tenants (id, name, created_at) VALUES (?, ?, ?)`
	TenantGet    = `SELECT id, name, created_at FROM tenants WHERE id = ?`
	TenantList   = `SELECT id, name, created_at FROM tenants ORDER BY name`
)

// TenantArgs are TenantInsert's arguments for t.
func TenantArgs(t store.Tenant) []any { return []any{t.ID, t.Name, Nanos(t.CreatedAt)} }

// ScanTenant reads a tenant from a row of TenantGet or TenantList.
func ScanTenant(sc Scanner) (store.Tenant, error) {
	var t store.Tenant
	var created int64
	err := sc.Scan(&t.ID, &t.Name, &created)
	t.CreatedAt = FromNanos(created)
	return t, err
}

// KeyCols are the columns ScanKey reads.
const KeyCols = `id, tenant, secret_hash, admin, created_at`

// API keys.
const (
	KeyInsert = `INSERT INTO api_keys (` + KeyCols + `) VALUES (?, ?, ?, ?, ?)`
	KeyGet    = `SELECT ` + KeyCols + ` FROM api_keys WHERE id = ?`
	KeyList   = `SELECT ` + KeyCols + ` FROM api_keys WHERE tenant = ? ORDER BY created_at`
	KeyDelete = `DELETE FROM api_keys WHERE id = ?`
)

// KeyArgs are KeyInsert's arguments for k.
func KeyArgs(k store.Key) []any {
	return []any{k.ID, k.Tenant, k.SecretHash, k.Admin, Nanos(k.CreatedAt)}
}

// ScanKey reads an API key from a row of KeyCols.
func ScanKey(sc Scanner) (store.Key, error) {
	var k store.Key
	var created int64
	err := sc.Scan(&k.ID, &k.Tenant, &k.SecretHash, &k.Admin, &created)
	k.CreatedAt = FromNanos(created)
	return k, err
}

// LayerCols are the columns ScanLayer reads.
const LayerCols = `tenant, name, tag, digest, kind, size, public, created_at, parents`

// Layers. LayerGet and LayerByDigest prefer the tenant's own layer to a
// public one (GetLayerArgs, LayerByDigestArgs).
const (
	LayerPut = `INSERT INTO layers (` + LayerCols + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (tenant, name, tag) DO UPDATE SET digest = excluded.digest, kind = excluded.kind,
			size = excluded.size, public = excluded.public, created_at = excluded.created_at,
			parents = excluded.parents`
	LayerGet = `SELECT ` + LayerCols + ` FROM layers
	WHERE name = ? AND tag = ? AND (tenant = ? OR public) ORDER BY tenant = ? DESC LIMIT 1`
	LayerByDigest = `SELECT ` + LayerCols + ` FROM layers
		WHERE digest = ? AND (tenant = ? OR public)
		ORDER BY tenant = ? DESC, created_at DESC LIMIT 1`
	LayerList   = `SELECT ` + LayerCols + ` FROM layers WHERE tenant = ? OR public ORDER BY name, tag`
	LayerDelete = `DELETE FROM layers WHERE tenant = ? AND name = ? AND tag = ? AND digest = ?`
)

// LayerUnused is the query of UnusedLayers (arguments: UnusedLayersArgs).
// instr is the dialect's substring position function, doc the sandbox
// document as text.
func LayerUnused(instr, doc string) string {
	return `SELECT ` + LayerCols + ` FROM layers l
	WHERE substr(l.name, 1, ?) = ? AND l.created_at < ?
	AND NOT EXISTS (SELECT 1 FROM layers o WHERE o.digest = l.digest
		AND NOT (o.tenant = l.tenant AND o.name = l.name AND o.tag = l.tag))
	AND NOT EXISTS (SELECT 1 FROM layers o WHERE ` + instr + `(o.parents, l.digest) > 0)
	AND NOT EXISTS (SELECT 1 FROM sandboxes s WHERE s.deleted_at IS NULL AND ` + instr + `(` + doc + `, l.digest) > 0)
	ORDER BY l.created_at LIMIT ?`
}

// UnusedLayersArgs are LayerUnused's arguments.
func UnusedLayersArgs(prefix string, before time.Time, limit int) []any {
	return []any{len(prefix), prefix, Nanos(before), limit}
}

// LayerArgs are LayerPut's arguments for l.
func LayerArgs(l store.Layer) []any {
	return []any{l.Tenant, l.Name, l.Tag, l.Digest, l.Kind, l.Size, l.Public, Nanos(l.CreatedAt), strings.Join(l.Parents, " ")}
}

// GetLayerArgs are LayerGet's arguments.
func GetLayerArgs(tenant, name, tag string) []any { return []any{name, tag, tenant, tenant} }

// LayerByDigestArgs are LayerByDigest's arguments.
func LayerByDigestArgs(tenant, digest string) []any { return []any{digest, tenant, tenant} }

// ScanLayer reads a layer record from a row of LayerCols.
func ScanLayer(sc Scanner) (store.Layer, error) {
	var l store.Layer
	var created int64
	var parents string
	err := sc.Scan(&l.Tenant, &l.Name, &l.Tag, &l.Digest, &l.Kind, &l.Size, &l.Public, &created, &parents)
	l.CreatedAt = FromNanos(created)
	l.Parents = strings.Fields(parents)
	return l, err
}

// Quotas and usage.
const (
	QuotaSet = `INSERT INTO tenant_usage (tenant, max_sandboxes, max_mcpu, max_memory_mb)
		VALUES (?, ?, ?, ?) ON CONFLICT (tenant) DO UPDATE SET max_sandboxes = excluded.max_sandboxes,
		max_mcpu = excluded.max_mcpu, max_memory_mb = excluded.max_memory_mb`
	UsageGet = `SELECT max_sandboxes, max_mcpu, max_memory_mb, sandboxes, mcpu, memory_mb
		FROM tenant_usage WHERE tenant = ?`
)

// QuotaArgs are QuotaSet's arguments.
func QuotaArgs(tenant string, q store.Quota) []any {
	return []any{tenant, q.Sandboxes, store.MilliCPU(q.CPU), q.MemoryMB}
}

// ScanUsage reads a row of UsageGet.
func ScanUsage(sc Scanner) (store.Usage, error) {
	var u store.Usage
	var maxMCPU, mcpu int64
	err := sc.Scan(&u.Quota.Sandboxes, &maxMCPU, &u.Quota.MemoryMB, &u.Sandboxes, &mcpu, &u.MemoryMB)
	u.Quota.CPU, u.CPU = float64(maxMCPU)/1000, float64(mcpu)/1000
	return u, err
}

// NodeDoc is what of a node lives in the JSON document; the rest is in
// columns.
func NodeDoc(n store.Node) ([]byte, error) {
	n.State, n.Drain, n.LastSeen = "", false, time.Time{}
	n.Allocated, n.Sandboxes = api.Resources{}, 0
	return json.Marshal(n)
}

// NodeUpsertCols are the columns a node's upsert writes, NodeArgs their
// values; the upsert's conflict clause is each store's (how it keeps the
// stored layers when n.Layers is nil differs).
const NodeUpsertCols = `id, doc, state, drain, last_seen, limit_mcpu, limit_memory_mb, limit_pids, limit_disk_mb`

// NodeArgs are the values of NodeUpsertCols for n; a node without a
// state is up.
func NodeArgs(n store.Node) ([]any, error) {
	doc, err := NodeDoc(n)
	if err != nil {
		return nil, fmt.Errorf("encode node: %w", err)
	}
	state := n.State
	if state == "" {
		state = store.NodeUp
	}
	return []any{n.ID, string(doc), state, B2i(n.Drain), Nanos(n.LastSeen), store.MilliCPU(n.Limit.CPU),
		n.Limit.MemoryMB, n.Limit.Pids, n.Limit.DiskMB}, nil
}

// NodeCols are the columns ScanNode reads.
const NodeCols = `doc, state, drain, last_seen, limit_mcpu, limit_memory_mb, limit_pids,
	alloc_mcpu, alloc_memory_mb, alloc_pids, sandboxes, limit_disk_mb, alloc_disk_mb`

// Nodes.
const (
	NodeGet   = `SELECT ` + NodeCols + ` FROM nodes WHERE id = ?`
	NodeList  = `SELECT ` + NodeCols + ` FROM nodes ORDER BY id`
	NodeDrain = `UPDATE nodes SET drain = ? WHERE id = ?`
)

// ScanNode reads a node from a row of NodeCols: its document, overridden
// by the columns.
func ScanNode(sc Scanner) (store.Node, error) {
	var n store.Node
	var doc []byte
	var drain int
	var seen, limitMCPU, allocMCPU, count int64
	if err := sc.Scan(&doc, &n.State, &drain, &seen, &limitMCPU, &n.Limit.MemoryMB, &n.Limit.Pids,
		&allocMCPU, &n.Allocated.MemoryMB, &n.Allocated.Pids, &count, &n.Limit.DiskMB, &n.Allocated.DiskMB); err != nil {
		return n, err
	}
	state, limit, alloc := n.State, n.Limit, n.Allocated
	if err := json.Unmarshal(doc, &n); err != nil {
		return n, fmt.Errorf("decode node: %w", err)
	}
	n.State, n.Drain, n.Limit, n.Allocated, n.Sandboxes = state, drain == 1, limit, alloc, int(count)
	n.LastSeen = FromNanos(seen)
	n.Limit.CPU, n.Allocated.CPU = float64(limitMCPU)/1000, float64(allocMCPU)/1000
	return n, nil
}

// NodeStateQuery is the update that moves node id to state if it is in
// one of the from states and, unless seenBefore is zero, was last seen
// before it.
func NodeStateQuery(id string, from []string, state string, seenBefore time.Time, d Dialect) (string, []any) {
	cond, fromArgs := d.StateIn(from)
	q := `UPDATE nodes SET state = ? WHERE id = ? AND ` + cond
	args := append([]any{state, id}, fromArgs...)
	if !seenBefore.IsZero() {
		q += ` AND last_seen < ?`
		args = append(args, Nanos(seenBefore))
	}
	return q, args
}

// Dialect writes the conditions whose SQL differs between databases.
type Dialect struct {
	// StateIn is the condition that the state column is one of states
	// (never empty).
	StateIn func(states []string) (cond string, args []any)
	// Label is the condition that the sandbox record's label k (a
	// checked key) is v.
	Label func(k, v string) (cond string, args []any)
	// DocHas is the condition that the record's JSON document holds the
	// string s (a layer digest: long enough to match nothing else).
	DocHas func(s string) (cond string, args []any)
}
