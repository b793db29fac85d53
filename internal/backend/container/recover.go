package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/mount"
)

// repairWorkers is how many broken sandboxes Recover restarts at once.
const repairWorkers = 8

// Recover implements backend.Backend. After an edge restart it:
//   - removes sandboxes whose create never finished (no sandbox.json),
//   - adopts running and paused containers as they are, but thaws those
//     a snapshot froze (the edge died before it thawed them),
//   - restarts, over their kept upper dir, containers whose init died and
//     running ones whose agent can no longer be reached (its socket is
//     gone or refuses connections),
//   - mounts again the layers of adopted sandboxes whose mounts are gone,
//   - deletes runc containers that have no sandbox directory,
//   - unmounts layers no sandbox uses and removes stale runtime layers.
func (b *Backend) Recover(ctx context.Context) ([]backend.Spec, error) {
	if b.runc.waitStray(ctx, 30*time.Second) {
		b.log.InfoContext(ctx, "recover: waited for runc commands the previous edge left running")
	}
	entries, err := os.ReadDir(filepath.Join(b.cfg.Root, "sandboxes"))
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	var (
		adopted  []*record
		broken   []*record
		runtimes = map[string]bool{b.runtime: true}
		known    = map[string]bool{}
	)
	for _, e := range entries {
		id := e.Name()
		known[id] = true
		if b.ownsBlank(id) {
			continue
		}
		rec, err := readRecord(filepath.Join(b.dir(id), "sandbox.json"))
		if err != nil {
			b.log.InfoContext(ctx, "recover: removing unfinished sandbox", "sandbox", id, "reason", err)
			if err := b.teardown(ctx, id, nil); err != nil {
				b.log.WarnContext(ctx, "recover: cleanup failed", "sandbox", id, "err", err)
			}
			continue
		}
		b.removeTrash(id)
		if rec.UIDs.Base == 0 { // made before sandboxes had id ranges
			if rec.UIDs, err = b.allocUIDs(id); err != nil {
				return nil, fmt.Errorf("recover %s: %w", id, err)
			}
		} else {
			b.mu.Lock()
			b.uids[rec.UIDs.Base] = id
			b.mu.Unlock()
		}
		if rec.IP.IsValid() && b.nets.net != nil {
			b.nets.net.Reserve(id, rec.IP)
		}
		if b.resetCutShort(ctx, id) {
			broken = append(broken, rec)
			if len(rec.Lowers) > 0 {
				runtimes[rec.Lowers[len(rec.Lowers)-1]] = true
			}
			continue
		}
		b.dropNextDisk(id) // old writable layers a reset left mounted
		st, err := b.runc.state(ctx, id)
		switch {
		case err == nil && st.Status == "paused":
			b.thawAfterSnapshot(ctx, id)
			adopted = append(adopted, rec)
		case err == nil && st.Status == "running":
			if why := b.unreachable(ctx, id); why != nil {
				b.log.WarnContext(ctx, "recover: the agent of a running sandbox cannot be reached; restarting it", "sandbox", id, "reason", why)
				broken = append(broken, rec)
				break
			}
			adopted = append(adopted, rec)
		default:
			broken = append(broken, rec)
		}
		if len(rec.Lowers) > 0 {
			runtimes[rec.Lowers[len(rec.Lowers)-1]] = true
		}
	}
	remount, err := b.recoverLayers(adopted)
	if err != nil {
		return nil, err
	}

	var specs []backend.Spec
	b.mu.Lock()
	for _, rec := range adopted {
		rec.acquired = true
		b.sandboxes[rec.Spec.ID] = rec
		specs = append(specs, rec.Spec)
	}
	b.mu.Unlock()
	for _, l := range remount {
		if _, err := b.layers.Acquire(ctx, l.Digest, mount.Source{Image: l.Path, Device: l.Device, DirectIO: l.OnDemand}); err != nil {
			// The sandbox runs on (its overlay holds the old mount); a reset
			// would fail until the layer mounts again.
			b.log.ErrorContext(ctx, "recover: mount a missing layer again", "layer", l.Digest, "err", err)
			continue
		}
		b.log.InfoContext(ctx, "recover: mounted a missing layer again", "layer", l.Digest)
	}
	// After a host reboot every sandbox is broken: restart them a few at a
	// time, not one by one.
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		workers = make(chan struct{}, repairWorkers)
	)
	for _, rec := range broken {
		wg.Add(1)
		workers <- struct{}{}
		go func() {
			defer func() { <-workers; wg.Done() }()
			if err := b.repair(ctx, rec); err != nil {
				b.log.ErrorContext(ctx, "recover: cannot restart sandbox; removing it", "sandbox", rec.Spec.ID, "err", err)
				b.teardown(ctx, rec.Spec.ID, rec)
				return
			}
			b.log.InfoContext(ctx, "recover: restarted sandbox over its kept files", "sandbox", rec.Spec.ID)
			mu.Lock()
			specs = append(specs, rec.Spec)
			mu.Unlock()
		}()
	}
	wg.Wait()

	if ids, err := b.runc.list(ctx); err == nil {
		for _, id := range ids {
			if !known[id] && !b.ownsBlank(id) { // a blank the pool started meanwhile
				b.log.InfoContext(ctx, "recover: deleting orphan container", "sandbox", id)
				b.runc.delete(ctx, id)
			}
		}
	}
	b.pruneRuntimes(runtimes)
	b.sweepCgroups(ctx, known)
	return specs, nil
}

// sweepCgroups removes the cgroups of blank sandboxes of an earlier edge
// that are still under the backend's parent: what a runc killed half way
// through a blank's start (before it wrote its state) left behind. Only
// blanks' (the parent may hold other backends' cgroups too), and only
// empty ones.
//
// A claimed blank's cgroup v2 directory keeps the blank's name (cgroup2
// has no rename; see renameContainer): the cgroups of known sandboxes are
// theirs whatever their names.
func (b *Backend) sweepCgroups(ctx context.Context, known map[string]bool) {
	inUse := map[string]bool{}
	for id := range known {
		if st, err := b.runc.readState(id); err == nil {
			for _, dir := range st.CgroupPaths {
				inUse[filepath.Clean(dir)] = true
			}
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", b.cfg.CgroupParent))
	for _, parent := range append(dirs, filepath.Join(cgroupRoot, b.cfg.CgroupParent)) {
		entries, _ := os.ReadDir(parent)
		for _, e := range entries {
			id := e.Name()
			if !e.IsDir() || !strings.HasPrefix(id, poolPrefix) || known[id] || b.ownsBlank(id) {
				continue
			}
			dir := filepath.Join(parent, id)
			if inUse[dir] {
				continue
			}
			unix.Rmdir(filepath.Join(dir, cmdCgroup))
			if err := unix.Rmdir(dir); err != nil {
				b.log.WarnContext(ctx, "recover: a cgroup of no sandbox is left", "cgroup", dir, "err", err)
				continue
			}
			b.log.InfoContext(ctx, "recover: removed a cgroup of no sandbox", "cgroup", dir)
		}
	}
}

// recoverLayers hands the layer pool the mounts the adopted sandboxes use
// and returns one entry per sandbox and layer whose mount is gone, to be
// acquired again (which mounts it).
func (b *Backend) recoverLayers(adopted []*record) ([]backend.Layer, error) {
	inUse := map[string]int{}
	var remount []backend.Layer
	for _, rec := range adopted {
		for _, l := range rec.Spec.Layers {
			if l.Dir {
				continue // not pooled: a directory, used as it is
			}
			h, err := contentdigest.Parse(l.Digest)
			if err != nil {
				return nil, fmt.Errorf("recover sandbox %s: %w", rec.Spec.ID, err)
			}
			if ok, err := mount.IsMountpoint(filepath.Join(b.cfg.Root, "layers", h)); err == nil && ok {
				inUse[l.Digest]++
			} else {
				remount = append(remount, l)
			}
		}
	}
	if err := b.layers.Recover(inUse); err != nil {
		return nil, fmt.Errorf("recover layers: %w", err)
	}
	return remount, nil
}

// unreachable says why a running sandbox's agent certainly cannot be
// reached — its socket is gone, or nothing listens on it any more — and
// nil otherwise. A slow agent is left alone: only a connection that cannot
// be made counts, never a late answer.
func (b *Backend) unreachable(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := b.Dial(ctx, id)
	if err == nil {
		c.Close()
		return nil
	}
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) {
		return err
	}
	return nil
}

// Repair implements backend.Repairer: a sandbox whose container stopped
// (its init, the agent, died) or whose agent socket refuses connections is
// restarted over its kept writable layer, as Recover does. A paused or
// reachable sandbox is left alone.
func (b *Backend) Repair(ctx context.Context, id string) (bool, error) {
	rec, err := b.get(id)
	if err != nil {
		return false, err
	}
	st, err := b.runc.state(ctx, id)
	switch {
	case err == nil && st.Status == "paused":
		return false, nil
	case err == nil && st.Status == "running":
		if b.unreachable(ctx, id) == nil {
			return false, nil
		}
	case err != nil && !errors.Is(err, errdefs.ErrNotFound):
		return false, err
	}
	b.log.WarnContext(ctx, "the agent of a sandbox is gone; restarting it over its kept files", "sandbox", id, "status", st.Status)
	if err := b.repair(ctx, rec); err != nil {
		return false, fmt.Errorf("repair sandbox %s: %w", id, err)
	}
	return true, nil
}

// repair restarts a sandbox whose container is gone, keeping its files.
// The layers of a live sandbox's record are already held.
func (b *Backend) repair(ctx context.Context, rec *record) error {
	id := rec.Spec.ID
	if err := b.runc.delete(ctx, id); err != nil {
		return err
	}
	if err := mount.Unmount(filepath.Join(b.dir(id), "rootfs")); err != nil {
		return err
	}
	for _, l := range rec.Spec.Layers {
		if _, err := os.Stat(l.Path); err != nil {
			return fmt.Errorf("layer %s: %w", l.Digest, errdefs.ErrNotFound)
		}
	}
	// (start swaps a live sandbox's runtime layer if it is gone.)
	if !rec.acquired {
		if _, err := os.Stat(rec.Lowers[len(rec.Lowers)-1]); err != nil {
			rec.Lowers = nil // its runtime layer is gone: take the current one
		}
		if err := b.acquire(ctx, rec); err != nil {
			return err
		}
	}
	if err := b.start(ctx, rec); err != nil {
		return err
	}
	if err := backend.WriteJSONFile(filepath.Join(b.dir(id), "sandbox.json"), rec); err != nil {
		return err
	}
	b.mu.Lock()
	b.sandboxes[id] = rec
	b.mu.Unlock()
	return nil
}

func readRecord(path string) (*record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	if rec.Spec.ID == "" || len(rec.Lowers) == 0 {
		return nil, errors.New("incomplete sandbox record")
	}
	return &rec, nil
}

// resetCutShort finishes, as a restart on an empty writable layer, a
// reset in place the previous edge did not finish (it left disk.next
// behind): whether the agent had switched roots or not, the sandbox was
// being reset.
func (b *Backend) resetCutShort(ctx context.Context, id string) bool {
	dir := b.dir(id)
	if _, err := os.Stat(filepath.Join(dir, "disk.next.img")); err != nil {
		return false
	}
	b.log.WarnContext(ctx, "recover: a reset in place was cut short; restarting the sandbox empty", "sandbox", id)
	b.runc.delete(ctx, id)
	mount.Unmount(filepath.Join(dir, "rootfs"))
	mount.Unmount(filepath.Join(dir, "disk"))
	b.dropNextDisk(id)
	os.Remove(filepath.Join(dir, "disk.img"))
	return true
}

// removeTrash deletes upper dirs left by resets that were interrupted.
func (b *Backend) removeTrash(id string) {
	entries, _ := os.ReadDir(b.dir(id))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "trash-") {
			os.RemoveAll(filepath.Join(b.dir(id), e.Name()))
		}
	}
}

func (b *Backend) pruneRuntimes(keep map[string]bool) {
	root := filepath.Join(b.cfg.Root, "runtime")
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if p := filepath.Join(root, e.Name()); !keep[p] {
			os.RemoveAll(p)
		}
	}
}

// thawAfterSnapshot resumes a paused sandbox if the freeze was a
// snapshot's that never ended; a sandbox paused through Pause stays so.
func (b *Backend) thawAfterSnapshot(ctx context.Context, id string) {
	marker := filepath.Join(b.dir(id), snapshotFreezeMarker)
	if _, err := os.Stat(marker); err != nil {
		return
	}
	if err := b.runc.resume(ctx, id); err != nil {
		b.log.ErrorContext(ctx, "recover: thaw a sandbox a snapshot left frozen", "sandbox", id, "err", err)
		return
	}
	os.Remove(marker)
	b.log.WarnContext(ctx, "recover: thawed a sandbox a snapshot left frozen", "sandbox", id)
}
