package posix_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/blob/blobtest"
	"github.com/dsec-project/dsec/internal/blob/posix"
)

func TestConformance(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store {
		s, err := posix.Open(t.TempDir(), posix.Options{NodeID: "node-a"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestSweepsOnlyOwnTemporaries: on a shared mount another node's temporary
// file may be a put in progress, however old it looks from here.
func TestSweepsOnlyOwnTemporaries(t *testing.T) {
	dir := t.TempDir()
	if _, err := posix.Open(dir, posix.Options{NodeID: "a"}); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour)
	for _, name := range []string{"a-1-x", "b-1-x", "a-2-fresh"} {
		p := filepath.Join(dir, ".tmp", name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if name != "a-2-fresh" {
			os.Chtimes(p, old, old)
		}
	}
	if _, err := posix.Open(dir, posix.Options{NodeID: "a"}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"a-1-x": false, "b-1-x": true, "a-2-fresh": true} {
		_, err := os.Stat(filepath.Join(dir, ".tmp", name))
		if got := err == nil; got != want {
			t.Errorf("%s kept = %v, want %v", name, got, want)
		}
	}
}
