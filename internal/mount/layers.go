package mount

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Layers is the node's pool of layer mounts. Each layer image is mounted
// once, read-only at root/<hex>, for as long as some sandbox uses it, and
// every sandbox's overlay stacks the shared mounts. Safe for concurrent use.
type Layers struct {
	root string

	mu sync.Mutex
	// mounts maps a digest's hex to its mount.
	mounts map[string]*layerMount
}

// layerMount is one layer's entry in the pool. Its fields are guarded by
// Layers.mu.
type layerMount struct {
	// refs counts the sandboxes using the mount.
	refs int
	// busy is non-nil while the layer is being mounted or unmounted, and
	// is closed when that ends; whoever wants the layer meanwhile waits.
	busy chan struct{}
}

// NewLayers returns an empty pool mounting under root, which it creates if
// need be. After a restart, call Recover before anything else.
func NewLayers(root string) (*Layers, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("open layer mounts: %w", err)
	}
	// mountinfo shows canonical paths; so must we, to find our mounts there.
	abs, err := filepath.Abs(root)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return nil, fmt.Errorf("open layer mounts: %w", err)
	}
	return &Layers{root: abs, mounts: make(map[string]*layerMount)}, nil
}

// Acquire returns the mountpoint of the layer with the given digest,
// mounting src there if no sandbox uses it yet,
// and counts one more user. Concurrent Acquires of one layer mount it once;
// a failed mount leaves no directory behind.
func (l *Layers) Acquire(ctx context.Context, digest string, src Source) (string, error) {
	h, err := contentdigest.Parse(digest)
	if err != nil {
		return "", fmt.Errorf("acquire layer: %w", err)
	}
	target := filepath.Join(l.root, h)
	for {
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("acquire layer %s: %w", digest, err)
		}
		l.mu.Lock()
		m := l.mounts[h]
		switch {
		case m == nil:
			m = &layerMount{busy: make(chan struct{})}
			l.mounts[h] = m
			l.mu.Unlock()
			err := mountLayer(src, target)
			l.mu.Lock()
			close(m.busy)
			m.busy = nil
			if err != nil {
				delete(l.mounts, h)
				l.mu.Unlock()
				return "", fmt.Errorf("acquire layer %s: %w", digest, err)
			}
			m.refs++
			l.mu.Unlock()
			return target, nil
		case m.busy == nil:
			m.refs++
			l.mu.Unlock()
			return target, nil
		}
		busy := m.busy
		l.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
		}
	}
}

// Release counts one user of the layer fewer, and unmounts it and removes
// its directory when none is left. Releasing a layer nobody acquired is
// errdefs.ErrNotFound. If the unmount fails the layer stays mounted, with
// no users, for the next Acquire to take up.
func (l *Layers) Release(digest string) error {
	h, err := contentdigest.Parse(digest)
	if err != nil {
		return fmt.Errorf("release layer: %w", err)
	}
	l.mu.Lock()
	m := l.mounts[h]
	if m == nil || m.busy != nil || m.refs == 0 {
		l.mu.Unlock()
		return fmt.Errorf("release layer %s: not acquired: %w", digest, errdefs.ErrNotFound)
	}
	m.refs--
	if m.refs > 0 {
		l.mu.Unlock()
		return nil
	}
	busy := make(chan struct{})
	m.busy = busy
	l.mu.Unlock()

	unmounted, err := unmountLayer(filepath.Join(l.root, h))
	l.mu.Lock()
	m.busy = nil
	close(busy)
	if unmounted {
		delete(l.mounts, h)
	}
	l.mu.Unlock()
	if err != nil {
		return fmt.Errorf("release layer %s: %w", digest, err)
	}
	return nil
}

// Stats returns the number of users of each mounted layer, by digest.
func (l *Layers) Stats() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := make(map[string]int, len(l.mounts))
	for h, m := range l.mounts {
		if m.busy == nil || m.refs > 0 {
			s["sha256:"+h] = m.refs
		}
	}
	return s
}

// Recover rebuilds the pool after the edge restarted. inUse maps the digest
// of each layer the surviving sandboxes use to how many of them use it.
// Their mounts are taken over with those counts; every other mount under
// the root is unmounted, and directories left without a mount are removed
// (non-empty ones are left alone). An in-use layer that is not mounted is
// reported as errdefs.ErrNotFound once everything else is done.
//
// Preconditions: l is fresh from NewLayers and nothing else uses it until
// Recover returns.
func (l *Layers) Recover(inUse map[string]int) error {
	want := make(map[string]int, len(inUse))
	for d, n := range inUse {
		h, err := contentdigest.Parse(d)
		if err != nil {
			return fmt.Errorf("recover layers: %w", err)
		}
		if n < 0 {
			return fmt.Errorf("recover layers: %w", errdefs.Invalid("layer %s has %d users", d, n))
		}
		want[h] = n
	}
	mounts, err := MountsUnder(l.root)
	if err != nil {
		return fmt.Errorf("recover layers: %w", err)
	}
	// Deepest first: a mount stacked inside a stray would keep it busy.
	sort.SliceStable(mounts, func(i, j int) bool {
		return strings.Count(mounts[i].Mountpoint, "/") > strings.Count(mounts[j].Mountpoint, "/")
	})

	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, m := range mounts {
		if m.Mountpoint == l.root {
			continue
		}
		h := l.hexOf(m.Mountpoint)
		if h != "" && want[h] > 0 && l.mounts[h] == nil {
			l.mounts[h] = &layerMount{refs: want[h]}
			continue
		}
		if err := Unmount(m.Mountpoint); err != nil {
			errs = append(errs, err)
			if h != "" && l.mounts[h] == nil {
				l.mounts[h] = &layerMount{}
			}
		}
	}
	if err := l.removeStrayDirs(); err != nil {
		errs = append(errs, err)
	}
	for h, n := range want {
		if n > 0 && l.mounts[h] == nil {
			errs = append(errs, errdefs.NotFound("layer sha256:%s is in use but not mounted", h))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("recover layers: %w", err)
	}
	return nil
}

// removeStrayDirs removes the empty directories under the root that no
// layer in the pool is mounted on.
//
// Preconditions: l.mu is held.
func (l *Layers) removeStrayDirs() error {
	entries, err := os.ReadDir(l.root)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, ok := l.mounts[e.Name()]; ok {
			continue
		}
		err := unix.Rmdir(filepath.Join(l.root, e.Name()))
		if err != nil && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove stray %s: %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// hexOf returns the digest hex of a layer mountpoint, root/<hex>, or "" if
// mp is something else.
func (l *Layers) hexOf(mp string) string {
	if filepath.Dir(mp) != l.root {
		return ""
	}
	h := filepath.Base(mp)
	if _, err := contentdigest.Parse("sha256:" + h); err != nil {
		return ""
	}
	return h
}

// mountLayer mounts src at target, creating target. A mount already
// there (left by a previous run that Recover was not asked about) is the
// same layer, since target is named by digest, and is taken over.
func mountLayer(src Source, target string) error {
	if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create mountpoint: %w", err)
	}
	if mounted, err := IsMountpoint(target); err != nil || mounted {
		return err
	}
	if err := EROFSFrom(src, target); err != nil {
		unix.Rmdir(target)
		return err
	}
	return nil
}

// unmountLayer unmounts target and removes it, and reports whether the
// layer is no longer mounted (whatever happened to the directory).
func unmountLayer(target string) (bool, error) {
	if err := Unmount(target); err != nil {
		return false, err
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return true, fmt.Errorf("remove mountpoint: %w", err)
	}
	return true, nil
}
