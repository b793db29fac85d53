package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/internal/store/sqlite"
	"github.com/dsec-project/dsec/internal/store/sqlstore"
)

// A new database gets the one schema at its version; reopening runs
// nothing; a database of a development build from before the squash is
// refused rather than half-migrated.
func TestSchemaVersion(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "dsec.db")
	mustOpen(t, path)
	mustOpen(t, path)
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != sqlstore.SchemaVersion() {
		t.Fatalf("schema version %d, want %d", v, sqlstore.SchemaVersion())
	}
	if _, err := db.ExecContext(ctx, `UPDATE schema_version SET version = 3`); err != nil {
		t.Fatal(err)
	}
	if s, err := sqlite.Open(ctx, path); err == nil {
		s.Close()
		t.Fatal("a version 3 database opened")
	} else if !strings.Contains(err.Error(), "recreate") {
		t.Fatalf("error %q does not say to recreate the database", err)
	}
}
