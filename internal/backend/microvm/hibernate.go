package microvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// memoryFile holds a hibernated guest's RAM and device state, in its
// sandbox's directory.
const memoryFile = "memory.state"

var (
	_ backend.Hibernator = (*Backend)(nil)
	_ backend.Forker     = (*Backend)(nil)
)

// Hibernate implements backend.Hibernator: the guest is stopped, its RAM
// and device state written to node-local disk, and its VMM ends, so the
// VM holds no memory until Resume starts a VMM from the saved state, with
// the guest's processes where they were. vm.json records it, so a
// hibernated VM stays so across an edge restart.
func (b *Backend) Hibernate(ctx context.Context, id string) (err error) {
	v, err := b.get(id)
	if err != nil {
		return err
	}
	if v.Machine.Type == TypeQ35 {
		return errdefs.Invalid("sandbox %s is a full VM: hibernate takes microVMs", id)
	}
	if v.hibernated() {
		return nil
	}
	t0 := time.Now()
	wasPaused := v.link.paused.Load()
	v.link.paused.Store(true)
	v.link.close()
	path := filepath.Join(v.Machine.Dir, memoryFile)
	tmp := path + ".tmp"
	p := v.proc()
	if err := b.cfg.VMM.SaveState(ctx, &v.Machine, p, tmp); err != nil {
		os.Remove(tmp)
		if !wasPaused {
			if rerr := b.cfg.VMM.Resume(context.WithoutCancel(ctx), &v.Machine, p); rerr == nil {
				v.link.paused.Store(false)
			}
		}
		return fmt.Errorf("hibernate sandbox %s: %w", id, err)
	}
	if err := syncFile(tmp); err != nil {
		return fmt.Errorf("hibernate sandbox %s: %w", id, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("hibernate sandbox %s: %w", id, err)
	}
	v.mu.Lock()
	v.Hibernated = true
	v.mu.Unlock()
	if err := backend.WriteJSONFile(filepath.Join(v.Machine.Dir, "vm.json"), v.record()); err != nil {
		v.mu.Lock()
		v.Hibernated = false
		v.mu.Unlock()
		os.Remove(path)
		return fmt.Errorf("hibernate sandbox %s: %w", id, err)
	}
	// From here the saved state is the guest: the VMM only holds memory.
	if err := b.cfg.VMM.Stop(ctx, &v.Machine, p); err != nil {
		return fmt.Errorf("hibernate sandbox %s: %w", id, err)
	}
	v.mu.Lock()
	v.Process = Process{}
	v.mu.Unlock()
	b.removeCgroup(id)
	if err := backend.WriteJSONFile(filepath.Join(v.Machine.Dir, "vm.json"), v.record()); err != nil {
		return fmt.Errorf("hibernate sandbox %s: %w", id, err)
	}
	st, _ := os.Stat(path)
	var size int64
	if st != nil {
		size = st.Size()
	}
	b.log.Info("hibernated", "sandbox", id, "took", time.Since(t0), "state_bytes", size)
	return nil
}

// wake starts a hibernated VM from its saved state and waits until its
// agent answers.
func (b *Backend) wake(ctx context.Context, v *vm) error {
	id := v.Spec.ID
	t0 := time.Now()
	path := filepath.Join(v.Machine.Dir, memoryFile)
	if err := b.restore(ctx, v, path); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	v.mu.Lock()
	v.Hibernated = false
	v.mu.Unlock()
	if err := backend.WriteJSONFile(filepath.Join(v.Machine.Dir, "vm.json"), v.record()); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	os.Remove(path)
	v.link.paused.Store(false)
	b.log.Info("woke from hibernation", "sandbox", id, "took", time.Since(t0))
	return nil
}

// restore starts v's VMM from the state at path and waits for its agent;
// on error no VMM runs.
func (b *Backend) restore(ctx context.Context, v *vm, path string) (err error) {
	os.Remove(filepath.Join(v.Machine.Dir, ConsoleLog))
	t0 := time.Now()
	p, err := b.cfg.VMM.Restore(ctx, &v.Machine, path)
	if err != nil {
		return err
	}
	loaded := time.Now()
	defer func() {
		b.log.Debug("restored", "sandbox", v.Spec.ID, "load", loaded.Sub(t0), "agent", time.Since(loaded), "err", err)
	}()
	v.mu.Lock()
	v.Process = p
	v.mu.Unlock()
	defer func() {
		if err != nil {
			v.link.close()
			b.cfg.VMM.Stop(context.WithoutCancel(ctx), &v.Machine, p)
			v.mu.Lock()
			v.Process = Process{}
			v.mu.Unlock()
		}
	}()
	v.link.paused.Store(false)
	if err := b.waitAgent(ctx, v); err != nil {
		return err
	}
	if b.cg != nil && v.Spec.Resources.CPU > 0 {
		if err := b.cg.place(b.cfg.CgroupParent, v.Spec.ID, p.Pid, v.Spec.Resources.CPU); err != nil {
			return err
		}
	}
	if err := b.cfg.VMM.Booted(ctx, &v.Machine, p); err != nil {
		b.log.Warn("after restore", "sandbox", v.Spec.ID, "err", err)
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
