package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/sqlite"
)

// A database of the squashed version 5 is upgraded in place: it gains
// the disk charge columns and then charges disk, and (7) the step replay
// counts and the sandboxes' backend column, filled from their docs.
func TestUpgradeFromSquashed(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "dsec.db")
	mustOpen(t, path)
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`ALTER TABLE sandboxes DROP COLUMN disk_mb`, `ALTER TABLE nodes DROP COLUMN limit_disk_mb`,
		`ALTER TABLE nodes DROP COLUMN alloc_disk_mb`, `ALTER TABLE trajectory_steps DROP COLUMN replays`,
		`ALTER TABLE trajectory_steps DROP COLUMN replayed_at`, `DROP INDEX sandboxes_count`, `ALTER TABLE sandboxes DROP COLUMN backend`,
		`INSERT INTO sandboxes (id, tenant, state, node, last_active, version, doc) VALUES ('old', 't', 'running', 'n', 0, 1, '{"API":{"id":"old","backend":"microvm"}}')`,
		`UPDATE schema_version SET version = 5`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("open a version 5 database: %v", err)
	}
	defer s.Close()
	n := store.Node{ID: "n", Addr: "http://n", State: store.NodeUp, LastSeen: time.Now().UTC(),
		Capacity: api.Resources{CPU: 1, MemoryMB: 1000, DiskMB: 100}, Limit: api.Resources{CPU: 1, MemoryMB: 1000, DiskMB: 100},
		Backends: []string{api.BackendContainer}}
	if err := s.UpsertNode(ctx, n); err != nil {
		t.Fatal(err)
	}
	sb := &store.Sandbox{API: api.Sandbox{ID: "sb", State: api.StateCreating, Node: "n",
		Resources: api.Resources{CPU: 0.1, MemoryMB: 10, DiskMB: 60}, CreatedAt: time.Now().UTC()}, Tenant: "t"}
	if err := s.PlaceSandboxes(ctx, []*store.Sandbox{sb}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetNode(ctx, "n"); err != nil || got.Allocated.DiskMB != 60 || got.Limit.DiskMB != 100 {
		t.Fatalf("after the upgrade: %+v, %v; want 60 of 100 MB disk allocated", got.Allocated, err)
	}
	// Version 7 read the backend of the sandbox there before out of its doc.
	counts, err := s.CountSandboxes(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	byBackend := map[string]int64{}
	for _, c := range counts {
		byBackend[c.Backend] += c.Count
	}
	if byBackend["microvm"] != 1 {
		t.Errorf("counts after the upgrade: %+v, want the old sandbox as microvm", counts)
	}
}
