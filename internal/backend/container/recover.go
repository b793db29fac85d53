package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/mount"
)

// Recover implements backend.Backend. After an edge restart it:
//   - removes sandboxes whose create never finished (no sandbox.json),
//   - adopts running and paused containers as they are,
//   - restarts containers whose init died, over their kept upper dir,
//   - deletes runc containers that have no sandbox directory,
//   - unmounts layers no sandbox uses and removes stale runtime layers.
func (b *Backend) Recover(ctx context.Context) ([]backend.Spec, error) {
	entries, err := os.ReadDir(filepath.Join(b.cfg.Root, "sandboxes"))
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	var (
		adopted  []*record
		broken   []*record
		inUse    = map[string]int{}
		runtimes = map[string]bool{b.runtime: true}
		known    = map[string]bool{}
	)
	for _, e := range entries {
		id := e.Name()
		known[id] = true
		rec, err := readRecord(filepath.Join(b.dir(id), "sandbox.json"))
		if err != nil {
			b.log.Info("recover: removing unfinished sandbox", "sandbox", id, "reason", err)
			if err := b.teardown(ctx, id, nil); err != nil {
				b.log.Warn("recover: cleanup failed", "sandbox", id, "err", err)
			}
			continue
		}
		b.removeTrash(id)
		st, err := b.runc.state(ctx, id)
		if err == nil && (st.Status == "running" || st.Status == "paused") {
			for _, l := range rec.Spec.Layers {
				inUse[l.Digest]++
			}
			rec.acquired = true
			adopted = append(adopted, rec)
		} else {
			broken = append(broken, rec)
		}
		if len(rec.Lowers) > 0 {
			runtimes[rec.Lowers[len(rec.Lowers)-1]] = true
		}
	}
	if err := b.layers.Recover(inUse); err != nil {
		return nil, fmt.Errorf("recover layers: %w", err)
	}

	var specs []backend.Spec
	b.mu.Lock()
	for _, rec := range adopted {
		b.sandboxes[rec.Spec.ID] = rec
		specs = append(specs, rec.Spec)
	}
	b.mu.Unlock()
	for _, rec := range broken {
		if err := b.repair(ctx, rec); err != nil {
			b.log.Error("recover: cannot restart sandbox; removing it", "sandbox", rec.Spec.ID, "err", err)
			b.teardown(ctx, rec.Spec.ID, rec)
			continue
		}
		b.log.Info("recover: restarted sandbox whose init had died", "sandbox", rec.Spec.ID)
		specs = append(specs, rec.Spec)
	}

	if ids, err := b.runc.list(ctx); err == nil {
		for _, id := range ids {
			if !known[id] {
				b.log.Info("recover: deleting orphan container", "sandbox", id)
				b.runc.delete(ctx, id)
			}
		}
	}
	b.pruneRuntimes(runtimes)
	return specs, nil
}

// repair restarts a sandbox whose container is gone, keeping its files.
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
	if _, err := os.Stat(rec.Lowers[len(rec.Lowers)-1]); err != nil {
		rec.Lowers = nil // its runtime layer is gone: take the current one
	}
	if err := b.acquire(ctx, rec); err != nil {
		return err
	}
	if err := b.start(ctx, rec); err != nil {
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
