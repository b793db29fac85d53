package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/postgres"
	"github.com/dsec-project/dsec/internal/store/storetest"
	"github.com/dsec-project/dsec/internal/testutil"
)

// One private server for the package; a fresh database per test.
var (
	once    sync.Once
	inst    *postgres.Instance
	instErr error
	dbSeq   atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if inst != nil {
		inst.Stop()
		os.RemoveAll(inst.Dir)
	}
	os.Exit(code)
}

func havePostgres() string {
	if _, err := postgres.FindBin(); err != nil {
		return err.Error()
	}
	return ""
}

// freshDB returns the DSN of a new, empty database.
func freshDB(t *testing.T) string {
	t.Helper()
	testutil.Require(t, havePostgres)
	once.Do(func() {
		dir, err := os.MkdirTemp("", "dsec-pg-test-")
		if err != nil {
			instErr = err
			return
		}
		inst, instErr = postgres.StartInstance(context.Background(), dir, true)
		if instErr != nil {
			os.RemoveAll(dir)
		}
	})
	if instErr != nil {
		t.Fatal(instErr)
	}
	dsn, err := inst.CreateDatabase(context.Background(), fmt.Sprintf("t%d", dbSeq.Add(1)))
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

func mustOpen(t *testing.T, dsn string) store.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStore(t *testing.T) {
	var dsn string
	open := func(t *testing.T) store.Store {
		dsn = freshDB(t)
		return mustOpen(t, dsn)
	}
	reopen := func(t *testing.T) store.Store { return mustOpen(t, dsn) }
	storetest.Run(t, open, reopen)
}

// Separate pools on one database stand in for separate server replicas.
func TestReplicas(t *testing.T) {
	storetest.RunReplicas(t, func(t *testing.T, n int) []store.Store {
		dsn := freshDB(t)
		var out []store.Store
		for range n {
			out = append(out, mustOpen(t, dsn))
		}
		return out
	})
}

// TestPlacementsNeverDeadlock runs group placements on two replicas at
// once, each of one tenant's sandboxes on nodes taken in crossing orders.
// A group transaction that charged its rows in its operations' order
// would deadlock with the other replica's (node a, the tenant, then node
// b against node b, then the tenant); PostgreSQL breaks a deadlock by
// failing one side after a second. None may happen, and every placement
// must succeed.
func TestPlacementsNeverDeadlock(t *testing.T) {
	ctx := context.Background()
	dsn := freshDB(t)
	ss := []store.Store{mustOpen(t, dsn), mustOpen(t, dsn)}
	const nodes = 4
	for i := range nodes {
		n := store.Node{ID: fmt.Sprintf("n%d", i), Addr: "http://n", State: store.NodeUp,
			Capacity: api.Resources{CPU: 1e6, MemoryMB: 1 << 40}, Limit: api.Resources{CPU: 1e6, MemoryMB: 1 << 40},
			Backends: []string{api.BackendContainer}, LastSeen: time.Now().UTC()}
		if err := ss[0].UpsertNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	before := deadlocks(t)
	var wg sync.WaitGroup
	var seq atomic.Int64
	for g := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				var sbs []*store.Sandbox
				// One or two sandboxes, on nodes that go up for even
				// goroutines and down for odd ones.
				for k := range 1 + j%2 {
					i := (g + j + k) % nodes
					if g%2 == 1 {
						i = nodes - 1 - i
					}
					sbs = append(sbs, &store.Sandbox{Tenant: "t",
						API: api.Sandbox{ID: fmt.Sprintf("sb%d", seq.Add(1)), State: api.StateCreating,
							Node: fmt.Sprintf("n%d", i), Resources: api.Resources{CPU: 0.1, MemoryMB: 1},
							CreatedAt: time.Now().UTC()}})
				}
				if err := ss[g%2].PlaceSandboxes(ctx, sbs); err != nil {
					t.Errorf("place: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := deadlocks(t) - before; n != 0 {
		t.Fatalf("PostgreSQL broke %d deadlocks between placements", n)
	}
}

// deadlocks counts the deadlocks the package's server has logged.
func deadlocks(t *testing.T) int {
	t.Helper()
	log, err := os.ReadFile(filepath.Join(inst.Dir, "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(log), "ERROR:  deadlock detected")
}

// TestLostAndUpdatesNeverDeadlock marks a node's sandboxes lost on one
// replica while the other runs live updates of them: both take the rows
// in id order, so neither waits on the other in a cycle.
func TestLostAndUpdatesNeverDeadlock(t *testing.T) {
	ctx := context.Background()
	dsn := freshDB(t)
	a, b := mustOpen(t, dsn), mustOpen(t, dsn)
	before := deadlocks(t)
	for round := range 6 {
		node := fmt.Sprintf("b%d", round)
		if err := a.UpsertNode(ctx, store.Node{ID: node, Addr: "http://b", State: store.NodeUp,
			Capacity: api.Resources{CPU: 1e6, MemoryMB: 1 << 40}, Limit: api.Resources{CPU: 1e6, MemoryMB: 1 << 40},
			Backends: []string{api.BackendContainer}, LastSeen: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
		// Inserted (the table's order) in another order than their ids'.
		var sbs []*store.Sandbox
		for _, i := range rand.Perm(256) {
			sbs = append(sbs, &store.Sandbox{Tenant: "t", API: api.Sandbox{ID: fmt.Sprintf("%s-%03d", node, i),
				State: api.StateRunning, Node: node, Resources: api.Resources{CPU: 0.1, MemoryMB: 1},
				CreatedAt: time.Now().UTC()}})
		}
		if err := a.PlaceSandboxes(ctx, sbs); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, sb := range sbs[g*4 : g*4+4] {
					sb.API.Error = "touched"
					if err := a.UpdateSandbox(ctx, sb); err != nil && !errors.Is(err, store.ErrConflict) {
						t.Errorf("update %s: %v", sb.API.ID, err)
					}
				}
			}()
		}
		if _, err := b.MarkSandboxesLost(ctx, node); err != nil {
			t.Errorf("mark lost: %v", err)
		}
		wg.Wait()
	}
	if n := deadlocks(t) - before; n != 0 {
		t.Fatalf("PostgreSQL broke %d deadlocks between marking lost and updates", n)
	}
}
