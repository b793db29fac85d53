package layer_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/layer"
)

// writeTree lays out a layer: "d/" a directory, "w:name" a whiteout,
// "o:dir/" an opaque directory, anything else a file holding its name.
func writeTree(t *testing.T, dir string, entries ...string) {
	t.Helper()
	for _, e := range entries {
		switch {
		case e[:2] == "w:":
			p := filepath.Join(dir, e[2:])
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := unix.Mknod(p, unix.S_IFCHR, 0); err != nil {
				t.Fatal(err)
			}
		case e[:2] == "o:":
			p := filepath.Join(dir, e[2:])
			os.MkdirAll(p, 0o755)
			if err := unix.Lsetxattr(p, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
				t.Fatal(err)
			}
		case e[len(e)-1] == '/':
			os.MkdirAll(filepath.Join(dir, e), 0o755)
		default:
			p := filepath.Join(dir, e)
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := os.WriteFile(p, []byte(dir+":"+e), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestSquash: base + squash(top layers) shows what base + top layers
// showed, for added, modified, deleted and replaced entries.
func TestSquash(t *testing.T) {
	requireMounts(t)
	base, mid, top := t.TempDir(), t.TempDir(), t.TempDir()
	writeTree(t, base, "keep", "mod", "gone", "dir/a", "dir/b", "swap/x", "opq/old", "file2dir", "deep/er/f")
	writeTree(t, mid, "mod", "w:gone", "dir/c", "w:dir/a", "o:opq/", "opq/new", "added", "w:file2dir")
	writeTree(t, top, "mod", "dir/d", "w:swap", "o:file2dir/", "file2dir/in", "w:added", "deep/er/g", "again")
	// Replace a directory by a file in the top layer.
	writeTree(t, top, "w:dir/b")
	out := t.TempDir()
	if err := layer.Squash(context.Background(), []string{top, mid}, out); err != nil {
		t.Fatal(err)
	}
	// The root's own attributes are the writable overlay's upper dir's.
	want := withoutRoot(tree(t, mountOverlay(t, top, mid, base)))
	got := withoutRoot(tree(t, mountOverlay(t, out, base)))
	if got != want {
		t.Errorf("squashed stack differs:\n got %s\nwant %s", got, want)
	}
}

func withoutRoot(tree string) string {
	var keep []string
	for _, line := range strings.Split(tree, "\n") {
		if strings.HasPrefix(line, "/") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}
