package postgres_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

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
