package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/sqlite"
	"github.com/dsec-project/dsec/internal/store/storetest"
)

func TestStore(t *testing.T) {
	var path string
	open := func(t *testing.T) store.Store {
		path = filepath.Join(t.TempDir(), "dsec.db")
		return mustOpen(t, path)
	}
	reopen := func(t *testing.T) store.Store { return mustOpen(t, path) }
	storetest.Run(t, open, reopen)
}

func mustOpen(t *testing.T, path string) store.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Two handles on one file stand in for two processes: the charges are
// still exact (SQLite serializes writers with its file lock).
func TestReplicas(t *testing.T) {
	storetest.RunReplicas(t, func(t *testing.T, n int) []store.Store {
		path := filepath.Join(t.TempDir(), "dsec.db")
		var out []store.Store
		for range n {
			out = append(out, mustOpen(t, path))
		}
		return out
	})
}
