package container

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWriteBandwidth: a bandwidth file that holds the value already is not
// written (each write walks every CPU cgroup of the host); one that holds
// another is, and a missing one is an error the caller can tell.
func TestWriteBandwidth(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.cfs_quota_us")
	if err := os.WriteFile(path, []byte("-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	modified := func() bool {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return !fi.ModTime().Equal(old)
	}
	if err := writeBandwidth(path, "-1"); err != nil {
		t.Fatal(err)
	}
	if modified() {
		t.Error("an unchanged value was written")
	}
	if err := writeBandwidth(path, "5000"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "5000" || !modified() {
		t.Errorf("a new value: the file holds %q", b)
	}
	if err := writeBandwidth(filepath.Join(t.TempDir(), "missing", "cpu.cfs_burst_us"), "5000"); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v, want not exist", err)
	}
}
