package microvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// forkDirPrefix names the directory in a parent's sandbox directory that
// holds a fork's saved state while its copies start.
const forkDirPrefix = "fork-"

// Fork implements backend.Forker. The parent's vCPUs stop, its RAM and
// device state go to a file (QEMU migration) and its writable disk is
// copied beside it (a reflink where the file system has them, else a
// sparse copy of the blocks in use); then the parent goes on, stopped
// only for that. Each copy is a new VMM started from the saved state
// over a copy of that disk and the parent's read-only layers; once its
// agent answers it gets a new identity (host name = its id, machine id,
// random seed). A hibernated parent's saved state is used as it is.
func (b *Backend) Fork(ctx context.Context, id string, copies []string) (_ []backend.Spec, err error) {
	v, err := b.get(id)
	if err != nil {
		return nil, err
	}
	if v.Machine.Type == TypeQ35 {
		return nil, errdefs.Invalid("sandbox %s is a full VM: fork with memory takes microVMs", id)
	}
	if len(copies) == 0 {
		return nil, errdefs.Invalid("fork of %s: no copies asked for", id)
	}
	seen := map[string]bool{id: true}
	for _, c := range copies {
		spec := v.Spec
		spec.ID = c
		if err := validate(spec); err != nil {
			return nil, err
		}
		if seen[c] {
			return nil, errdefs.Invalid("fork of %s: copy id %s given twice", id, c)
		}
		seen[c] = true
	}
	work, err := os.MkdirTemp(v.Machine.Dir, forkDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("fork %s: %w", id, err)
	}
	defer os.RemoveAll(work)

	t0 := time.Now()
	state, disk := filepath.Join(work, memoryFile), filepath.Join(work, "rw.img")
	if v.hibernated() {
		state = filepath.Join(v.Machine.Dir, memoryFile)
		if err := copyDisk(ctx, filepath.Join(v.Machine.Dir, "rw.img"), disk); err != nil {
			return nil, fmt.Errorf("fork %s: %w", id, err)
		}
	} else if err := b.saveForFork(ctx, v, state, disk); err != nil {
		return nil, fmt.Errorf("fork %s: %w", id, err)
	}
	saved := time.Since(t0)

	specs := make([]backend.Spec, len(copies))
	errs := make([]error, len(copies))
	made := make([]*vm, len(copies))
	var wg sync.WaitGroup
	for i, c := range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			made[i], errs[i] = b.forkCopy(ctx, v, c, state, disk)
			if errs[i] == nil {
				specs[i] = made[i].Spec
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for i, c := range made {
			if c != nil {
				b.Destroy(context.WithoutCancel(ctx), copies[i])
			}
		}
		return nil, fmt.Errorf("fork %s: %w", id, err)
	}
	b.log.Info("forked", "sandbox", id, "copies", len(copies), "saved", saved, "took", time.Since(t0))
	return specs, nil
}

// saveForFork saves the running parent's memory to state and copies its
// writable disk to disk, then lets it go on (unless it was paused).
func (b *Backend) saveForFork(ctx context.Context, v *vm, state, disk string) error {
	wasPaused := v.link.paused.Load()
	v.link.paused.Store(true)
	p := v.proc()
	defer func() {
		if wasPaused {
			return
		}
		if err := b.cfg.VMM.Resume(context.WithoutCancel(ctx), &v.Machine, p); err != nil {
			b.log.Error("fork: the parent does not go on", "sandbox", v.Spec.ID, "err", err)
			return
		}
		v.link.paused.Store(false)
	}()
	// The guest's disk writes in flight are drained when QEMU stops it,
	// and its page cache is in the saved RAM: disk and memory agree.
	if err := b.cfg.VMM.SaveState(ctx, &v.Machine, p, state); err != nil {
		return err
	}
	return copyDisk(ctx, filepath.Join(v.Machine.Dir, "rw.img"), disk)
}

// forkCopy makes one copy of parent from the saved state; on error
// nothing of it is left.
func (b *Backend) forkCopy(ctx context.Context, parent *vm, id, state, disk string) (_ *vm, err error) {
	dir := b.dir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("fork copy %s: %w", id, err)
	}
	spec := parent.Spec
	spec.ID = id
	c := &vm{Spec: spec, Machine: parent.Machine}
	c.Machine.ID, c.Machine.Dir = id, dir
	c.Machine.Drives = append([]Drive(nil), parent.Machine.Drives...)
	for i, d := range c.Machine.Drives {
		if filepath.Dir(d.Path) == parent.Machine.Dir {
			c.Machine.Drives[i].Path = filepath.Join(dir, filepath.Base(d.Path))
		}
	}
	if c.Machine.CID != 0 {
		c.Machine.CID = cidFor(id)
	}
	c.link = newLink(&c.Machine, b.cfg.Link)
	defer func() {
		if err != nil {
			b.teardown(context.WithoutCancel(ctx), id, c)
		}
	}()
	if err := b.writeConfigDrive(c); err != nil {
		return nil, fmt.Errorf("fork copy %s: %w", id, err)
	}
	if err := copyDisk(ctx, disk, filepath.Join(dir, "rw.img")); err != nil {
		return nil, fmt.Errorf("fork copy %s: %w", id, err)
	}
	if err := b.restore(ctx, c, state); err != nil {
		return nil, fmt.Errorf("fork copy %s: %w", id, err)
	}
	if err := b.reidentify(ctx, c); err != nil {
		return nil, fmt.Errorf("fork copy %s: %w", id, err)
	}
	if err := backend.WriteJSONFile(filepath.Join(dir, "vm.json"), c.record()); err != nil {
		return nil, fmt.Errorf("fork copy %s: %w", id, err)
	}
	b.mu.Lock()
	b.vms[id] = c
	b.mu.Unlock()
	return c, nil
}

// reidentify gives a restored copy its own host name, machine id and
// random seed, through its agent.
func (b *Backend) reidentify(ctx context.Context, v *vm) error {
	mid := make([]byte, 16)
	seed := make([]byte, 64)
	rand.Read(mid)
	rand.Read(seed)
	ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return v.link.dial(ctx) })
	defer ag.Close()
	return ag.SetIdentity(ctx, agent.Identity{Hostname: v.Spec.ID, MachineID: hex.EncodeToString(mid), Seed: seed})
}

// copyDisk copies a writable disk image: a reflink (copy on write) where
// the file system has them, else the blocks in use, holes kept.
func copyDisk(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "--reflink=auto", "--sparse=always", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy disk: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
