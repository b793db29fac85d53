package edge

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStateVersion: a new or unversioned data directory is stamped; one
// written by a newer binary is refused with a message that says so.
func TestStateVersion(t *testing.T) {
	dir := t.TempDir()
	if err := CheckStateVersion(dir); err != nil {
		t.Fatalf("new dir: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil || !strings.Contains(string(b), `"version":1`) {
		t.Fatalf("stamp = %q, %v", b, err)
	}
	if err := CheckStateVersion(dir); err != nil {
		t.Fatalf("same version: %v", err)
	}
	os.WriteFile(filepath.Join(dir, stateFile), []byte(`{"version":99}`), 0o600)
	if err := CheckStateVersion(dir); err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("newer state = %v; want a refusal", err)
	}
	os.WriteFile(filepath.Join(dir, stateFile), []byte(`garbage`), 0o600)
	if err := CheckStateVersion(dir); err == nil {
		t.Fatal("unreadable state accepted")
	}
}
