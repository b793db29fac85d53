package testutil

import (
	"context"
	"os"
	"testing"

	"github.com/dsec-project/dsec/internal/store/postgres"
)

// Postgres requires PostgreSQL's server binaries (Debian: postgresql).
func Postgres() string {
	if _, err := postgres.FindBin(); err != nil {
		return err.Error()
	}
	return ""
}

// StartPostgres starts a private PostgreSQL server for the test (its own
// directory and socket, no TCP port) and returns the DSN of an empty
// database on it. It is stopped and removed when the test ends.
func StartPostgres(t testing.TB) string {
	t.Helper()
	Require(t, Postgres)
	dir, err := os.MkdirTemp("", "dsec-pg-")
	if err != nil {
		t.Fatal(err)
	}
	in, err := postgres.StartInstance(context.Background(), dir, true)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Stop()
		os.RemoveAll(dir)
	})
	dsn, err := in.CreateDatabase(context.Background(), "dsec")
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}
