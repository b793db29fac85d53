package sqlstore

import (
	"strings"
	"testing"
)

// Every token of the one schema has a spelling in both dialects.
func TestSchemaSpelled(t *testing.T) {
	for _, d := range []SchemaDialect{SQLiteSchema, PostgresSchema} {
		s := Schema(d)
		if strings.ContainsAny(s, "{}") {
			t.Errorf("%s schema keeps a token: %s", d.Name, s)
		}
		if n := strings.Count(s, "CREATE TABLE"); n != 9 {
			t.Errorf("%s schema creates %d tables, want 9", d.Name, n)
		}
	}
	if _, err := Migration(SQLiteSchema, 2); err == nil {
		t.Error("a version 2 database migrates")
	}
	if _, err := Migration(SQLiteSchema, SchemaVersion()+1); err == nil {
		t.Error("a newer database migrates")
	}
	if q, err := Migration(PostgresSchema, 0); err != nil || len(q) != 2 {
		t.Errorf("postgres migration from empty: %d statements, %v", len(q), err)
	}
}
