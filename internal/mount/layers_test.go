package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// newTestLayers returns a pool on a fresh root; when the test ends,
// whatever is still mounted under the root is unmounted before the root
// is removed.
func newTestLayers(t *testing.T) (*Layers, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "layers")
	l, err := NewLayers(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mounts, err := MountsUnder(root)
		if err != nil {
			t.Error(err)
			return
		}
		for i := len(mounts) - 1; i >= 0; i-- {
			t.Errorf("left mounted: %s", mounts[i].Mountpoint)
			Unmount(mounts[i].Mountpoint)
		}
	})
	return l, root
}

// mountsAt counts the mounts at exactly target.
func mountsAt(t *testing.T, target string) int {
	t.Helper()
	infos, err := Mountinfo()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range infos {
		if m.Mountpoint == target {
			n++
		}
	}
	return n
}

func hexOf(digest string) string { return strings.TrimPrefix(digest, "sha256:") }

func TestLayersRefcount(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	digest, img := buildImage(t, testTree{files: map[string]string{"f": "layer"}})
	l, root := newTestLayers(t)
	target := filepath.Join(root, hexOf(digest))

	steps := []struct {
		name        string
		do          func() error
		wantRefs    int
		wantMounted bool
	}{
		{"first acquire mounts", func() error { _, err := l.Acquire(ctx, digest, Source{Image: img}); return err }, 1, true},
		{"second acquire shares", func() error { _, err := l.Acquire(ctx, digest, Source{Image: img}); return err }, 2, true},
		{"release keeps it for the other user", func() error { return l.Release(digest) }, 1, true},
		{"last release unmounts", func() error { return l.Release(digest) }, 0, false},
		{"acquire after all released mounts again", func() error { _, err := l.Acquire(ctx, digest, Source{Image: img}); return err }, 1, true},
		{"and releases again", func() error { return l.Release(digest) }, 0, false},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if err := s.do(); err != nil {
				t.Fatal(err)
			}
			if got := l.Stats()[digest]; got != s.wantRefs {
				t.Errorf("refs = %d, want %d", got, s.wantRefs)
			}
			wantMounts := 0
			if s.wantMounted {
				wantMounts = 1
				if b, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(b) != "layer" {
					t.Errorf("f = %q, %v", b, err)
				}
			} else if exists(target) {
				t.Errorf("%s left behind", target)
			}
			if n := mountsAt(t, target); n != wantMounts {
				t.Errorf("%d mounts at the target, want %d", n, wantMounts)
			}
		})
	}

	errTests := []struct {
		name string
		err  func() error
		want error
	}{
		{"release of an unacquired layer", func() error { return l.Release(digest) }, errdefs.ErrNotFound},
		{"acquire with a bad digest", func() error { _, err := l.Acquire(ctx, "sha256:nope", Source{Image: img}); return err }, errdefs.ErrInvalid},
		{"release with a bad digest", func() error { return l.Release("nope") }, errdefs.ErrInvalid},
		{"acquire with a cancelled context", func() error {
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			_, err := l.Acquire(cctx, digest, Source{Image: img})
			return err
		}, context.Canceled},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.err(); !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestLayersFailedMountLeavesNothing(t *testing.T) {
	requireMounts(t)
	junk := filepath.Join(t.TempDir(), "junk.erofs")
	if err := os.WriteFile(junk, make([]byte, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	l, root := newTestLayers(t)
	if _, err := l.Acquire(context.Background(), digest, Source{Image: junk}); err == nil {
		t.Fatal("acquired a layer from a file of zeros")
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("left in the root: %v", entries)
	}
	if s := l.Stats(); len(s) != 0 {
		t.Errorf("Stats = %v, want empty", s)
	}
}

// TestLayersConcurrent has many sandboxes start and stop at once on the
// same layers: each layer is mounted once, and all are gone at the end.
func TestLayersConcurrent(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	const users = 16
	type img struct{ digest, path string }
	var imgs []img
	for i := range 3 {
		d, p := buildImage(t, testTree{files: map[string]string{"id": fmt.Sprint(i)}})
		imgs = append(imgs, img{d, p})
	}
	l, root := newTestLayers(t)

	t.Run("acquire", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, users*len(imgs))
		for _, im := range imgs {
			for range users {
				wg.Go(func() {
					mp, err := l.Acquire(ctx, im.digest, Source{Image: im.path})
					if err == nil && mp != filepath.Join(root, hexOf(im.digest)) {
						err = fmt.Errorf("mountpoint %s", mp)
					}
					if err != nil {
						errs <- err
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		want := map[string]int{}
		for _, im := range imgs {
			want[im.digest] = users
			if n := mountsAt(t, filepath.Join(root, hexOf(im.digest))); n != 1 {
				t.Errorf("%s mounted %d times, want once", im.digest, n)
			}
		}
		if got := l.Stats(); !reflect.DeepEqual(got, want) {
			t.Errorf("Stats = %v, want %v", got, want)
		}
	})
	// churn is used only here, so it keeps being mounted and unmounted
	// while other callers wait for it.
	churnDigest, churnPath := buildImage(t, testTree{files: map[string]string{"id": "churn"}})
	churn := img{churnDigest, churnPath}
	t.Run("acquire and release interleaved", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 64 {
			im := imgs[i%len(imgs)]
			if i%2 == 0 {
				im = churn
			}
			wg.Go(func() {
				if _, err := l.Acquire(ctx, im.digest, Source{Image: im.path}); err != nil {
					t.Error(err)
					return
				}
				if err := l.Release(im.digest); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if n := mountsAt(t, filepath.Join(root, hexOf(churn.digest))); n != 0 {
			t.Errorf("churned layer mounted %d times after its last release", n)
		}
	})
	t.Run("release all", func(t *testing.T) {
		var wg sync.WaitGroup
		for _, im := range imgs {
			for range users {
				wg.Go(func() {
					if err := l.Release(im.digest); err != nil {
						t.Error(err)
					}
				})
			}
		}
		wg.Wait()
		if s := l.Stats(); len(s) != 0 {
			t.Errorf("Stats = %v, want empty", s)
		}
		if mounts, _ := MountsUnder(root); len(mounts) != 0 {
			t.Errorf("still mounted: %v", mounts)
		}
		if entries, _ := os.ReadDir(root); len(entries) != 0 {
			t.Errorf("left in the root: %v", entries)
		}
	})
}

// TestLayersRecover simulates an edge restart: a new pool on the same root
// takes over the mounts survivors use and cleans up the rest.
func TestLayersRecover(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	kept, keptImg := buildImage(t, testTree{files: map[string]string{"f": "kept"}})
	idle, idleImg := buildImage(t, testTree{files: map[string]string{"f": "idle"}})
	orphan, orphanImg := buildImage(t, testTree{files: map[string]string{"f": "orphan"}})
	before, root := newTestLayers(t)
	for _, a := range []struct{ digest, img string }{{kept, keptImg}, {kept, keptImg}, {idle, idleImg}, {orphan, orphanImg}} {
		if _, err := before.Acquire(ctx, a.digest, Source{Image: a.img}); err != nil {
			t.Fatal(err)
		}
	}
	strayHex := filepath.Join(root, strings.Repeat("cd", 32))
	strayOther := filepath.Join(root, "junk")
	nonEmpty := filepath.Join(root, "notes")
	for _, d := range []string{strayHex, strayOther, nonEmpty} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(nonEmpty, "keep"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	// The restart: before is forgotten, its mounts stay.
	after, err := NewLayers(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := after.Recover(map[string]int{kept: 2, idle: 0}); err != nil {
		t.Fatal(err)
	}

	t.Run("in-use layer kept with its count", func(t *testing.T) {
		if got := after.Stats(); !reflect.DeepEqual(got, map[string]int{kept: 2}) {
			t.Errorf("Stats = %v", got)
		}
		if n := mountsAt(t, filepath.Join(root, hexOf(kept))); n != 1 {
			t.Errorf("kept layer mounted %d times", n)
		}
	})
	t.Run("unused layers unmounted and removed", func(t *testing.T) {
		for _, d := range []string{idle, orphan} {
			if p := filepath.Join(root, hexOf(d)); exists(p) {
				t.Errorf("%s left behind", p)
			}
		}
		var names []string
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		if want := []string{hexOf(kept), "notes"}; !reflect.DeepEqual(names, want) {
			t.Errorf("root holds %v, want %v", names, want)
		}
	})
	t.Run("acquire takes up the recovered mount", func(t *testing.T) {
		if _, err := after.Acquire(ctx, kept, Source{Image: keptImg}); err != nil {
			t.Fatal(err)
		}
		if n := mountsAt(t, filepath.Join(root, hexOf(kept))); n != 1 {
			t.Errorf("kept layer mounted %d times", n)
		}
		for range 3 {
			if err := after.Release(kept); err != nil {
				t.Fatal(err)
			}
		}
		if exists(filepath.Join(root, hexOf(kept))) {
			t.Error("kept layer left behind after its last release")
		}
	})
	t.Run("in-use layer that is not mounted", func(t *testing.T) {
		again, err := NewLayers(root)
		if err != nil {
			t.Fatal(err)
		}
		if err := again.Recover(map[string]int{kept: 1}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("err = %v, want ErrNotFound", err)
		}
	})
	t.Run("bad digest", func(t *testing.T) {
		again, err := NewLayers(root)
		if err != nil {
			t.Fatal(err)
		}
		if err := again.Recover(map[string]int{"nope": 1}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("err = %v, want ErrInvalid", err)
		}
	})
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
