package container

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

func mkTree(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "disk"), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 30); err != nil { // sparse, as a writable layer's image
		t.Fatal(err)
	}
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// A destroyed sandbox's directory leaves its place at once and is gone
// from the trash by the time wait returns; what a previous backend left
// in the trash is removed by the next one.
func TestTrash(t *testing.T) {
	root := t.TempDir()
	trashDir := filepath.Join(root, "trash")
	// Left by a backend that died before its trash was empty.
	mkTree(t, filepath.Join(trashDir, "sb-left.1.1"))

	tr, err := newTrash(trashDir, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, id := range []string{"sb-a", "sb-b", "pool-c"} {
		d := filepath.Join(root, "sandboxes", id)
		mkTree(t, d)
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := tr.put(d); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(d); !os.IsNotExist(err) {
			t.Fatalf("%s is still in place after put (%v)", d, err)
		}
	}
	// The same name again: a sandbox id can come back after its destroy.
	mkTree(t, dirs[0])
	if err := tr.put(dirs[0]); err != nil {
		t.Fatal(err)
	}
	if err := tr.put(filepath.Join(root, "sandboxes", "never-made")); err != nil {
		t.Fatalf("put of a missing directory: %v", err)
	}
	tr.wait()
	if left := entries(t, trashDir); len(left) != 0 {
		t.Fatalf("the trash still holds %v", left)
	}
	if left := entries(t, filepath.Join(root, "sandboxes")); len(left) != 0 {
		t.Fatalf("sandboxes still holds %v", left)
	}
}

// Without a trash (a backend made in a test), put removes at once.
func TestNoTrashRemovesAtOnce(t *testing.T) {
	d := filepath.Join(t.TempDir(), "sb-x")
	mkTree(t, d)
	var tr *trash
	if err := tr.put(d); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(d); !os.IsNotExist(err) {
		t.Fatalf("%s is still there (%v)", d, err)
	}
	tr.wait()
}
