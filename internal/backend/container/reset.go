package container

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/disk"
	"github.com/dsec-project/dsec/internal/mount"
)

// Reset implements backend.Backend. The fast path keeps the container —
// its namespaces, cgroup, network interface and egress programs — and
// swaps what a sandbox can change: the agent kills every other process,
// then pivots onto a fresh overlay over a new, empty writable layer that
// the edge built, with a fresh /dev and a new IPC namespace, and
// re-executes itself (see agent.handleReset). When that cannot be done
// (the agent is gone, paused or too old, or anything fails), the
// container is restarted instead.
func (b *Backend) Reset(ctx context.Context, id string) error {
	rec, err := b.get(id)
	if err != nil {
		return err
	}
	t0 := time.Now()
	err = b.resetInPlace(ctx, rec, nil)
	if err == nil {
		b.log.DebugContext(ctx, "reset in place", "sandbox", id, "took", time.Since(t0))
		return nil
	}
	if !errors.Is(err, agent.ErrNoReset) {
		b.log.WarnContext(ctx, "reset in place failed; restarting the container", "sandbox", id, "err", err)
	}
	return b.restart(ctx, id, rec)
}

// errPaused: a frozen agent cannot reset anything.
var errPaused = fmt.Errorf("sandbox is paused: %w", agent.ErrNoReset)

// resetInPlace switches the sandbox's root onto a fresh overlay; ident,
// if not nil, is the identity a blank sandbox of the pool takes on (see
// claim).
func (b *Backend) resetInPlace(ctx context.Context, rec *record, ident *agent.ResetIdentity) (err error) {
	id := rec.Spec.ID
	dir := b.dir(id)
	st, err := b.runc.readState(id)
	if err != nil {
		return fmt.Errorf("%w: %w", agent.ErrNoReset, err)
	}
	if frozen(st) {
		return errPaused
	}
	conn, err := b.Dial(ctx, id)
	if err != nil {
		return fmt.Errorf("%w: %w", agent.ErrNoReset, err)
	}
	defer conn.Close()
	tDisk := time.Now()
	next := filepath.Join(dir, "disk.next")
	img := next + ".img"
	defer func() {
		if err != nil {
			b.dropNextDisk(id)
		}
	}()
	// A blank sandbox of the pool comes with its next writable layer
	// made (startBlank).
	if prepared := rec.nextDiskMB; prepared == 0 || prepared != diskMB(rec.Spec) {
		if err := b.prepareNextDisk(ctx, id, diskMB(rec.Spec)); err != nil {
			return err
		}
	}
	rec.nextDiskMB = 0
	tRoot := time.Now()
	// The agent gets the new root as a detached mount; the edge's
	// namespace never holds a sandbox's root (see startNS). A sandbox
	// started by an older edge still has one mounted there.
	if err := mount.Unmount(filepath.Join(dir, "rootfs")); err != nil {
		return err
	}
	root, releaseRoot, err := b.detachedRootfs(rec, next)
	if err != nil {
		return err
	}
	defer releaseRoot()
	var tasks []int
	if ident != nil { // a claim: the blank's agent takes the tasks files along
		if tasks, err = commandsCgroups(st, rec.Spec.Resources); err != nil {
			return err
		}
		defer closeAll(tasks)
	}
	tAgent := time.Now()
	res, err := agent.ResetRoot(ctx, conn, root, tasks, ident)
	if err != nil {
		return err
	}
	tSwap := time.Now()
	// The old layer moves aside and goes in the background: its last
	// unmount tears down its file system and loop device. A blank
	// sandbox of the pool has none.
	if had, err := mount.IsMountpoint(filepath.Join(dir, "disk")); err == nil && had {
		old, err := os.MkdirTemp(dir, "disk.old-")
		if err != nil {
			return err
		}
		if err := unix.Mount(filepath.Join(dir, "disk"), old, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move the old writable layer: %w", err)
		}
		go func() {
			unix.Unmount(old, unix.MNT_DETACH)
			os.Remove(old)
		}()
	} else if err := os.MkdirAll(filepath.Join(dir, "disk"), 0o700); err != nil {
		return err
	}
	if err := os.Rename(img, filepath.Join(dir, "disk.img")); err != nil {
		return err
	}
	if err := unix.Mount(next, filepath.Join(dir, "disk"), "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new writable layer: %w", err)
	}
	os.Remove(next)
	tWait := time.Now()
	// An unused agent (a claimed blank) serves on without re-executing.
	if !res.Kept {
		if err := b.waitAgent(ctx, id, res.Instance); err != nil {
			return err
		}
	}
	tUp := time.Now()
	// The new agent forks its commands from a thread of its own: it needs
	// the commands' cgroups again (a kept one took them with the root).
	if res.CommandsPlaced {
		if err := commandsPlaced(st, rec.Spec.Resources); err != nil {
			return fmt.Errorf("commands' limits: %w", err)
		}
	} else if err := b.limitCommands(ctx, rec); err != nil {
		return fmt.Errorf("commands' limits after reset: %w", err)
	}
	// Allowlisted names resolve again, as after a restart.
	if rec.Spec.NeedsNetwork && rec.CgroupID != 0 {
		if err := b.applyNetwork(ctx, rec, rec.Spec.Network); err != nil {
			return fmt.Errorf("network rules: %w", err)
		}
	}
	tCPU := time.Now()
	resetCounters(st)
	b.recordBaseline(id)
	b.log.DebugContext(ctx, "reset in place: steps", "sandbox", id, "disk", tRoot.Sub(tDisk), "overlay", tAgent.Sub(tRoot),
		"agent", tSwap.Sub(tAgent), "agent_reported", time.Duration(res.DurationMs)*time.Millisecond,
		"killed", res.Killed, "kept", res.Kept, "swap", tWait.Sub(tSwap), "agent_up", tUp.Sub(tWait), "cpu", tCPU.Sub(tUp), "baseline", time.Since(tCPU))
	return nil
}

// waitAgent waits until the re-executed agent answers: until then a
// connection may still reach the old one, which exec then cuts.
func (b *Backend) waitAgent(ctx context.Context, id, old string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
		h, err := c.Health(ctx)
		c.Close()
		if err == nil && h.Instance != old && h.Pid == 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent after reset: %v: %w", err, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// dropNextDisk removes a writable layer a reset in place prepared and did
// not install, and one it moved aside and did not unmount yet.
// prepareNextDisk makes a sandbox's next writable layer, mounted at
// disk.next with its upper and work dirs, for a reset in place to switch
// to.
func (b *Backend) prepareNextDisk(ctx context.Context, id string, sizeMB int64) error {
	next := filepath.Join(b.dir(id), "disk.next")
	b.dropNextDisk(id)
	if err := os.Mkdir(next, 0o700); err != nil {
		return err
	}
	img := next + ".img"
	if err := b.disks.Create(ctx, img, sizeMB); err != nil {
		return err
	}
	if err := disk.Mount(img, next); err != nil {
		return err
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(next, d), 0o755); err != nil {
			return fmt.Errorf("writable layer: %w", err)
		}
	}
	return nil
}

func (b *Backend) dropNextDisk(id string) {
	old, _ := filepath.Glob(filepath.Join(b.dir(id), "disk.old-*"))
	for _, p := range append(old, filepath.Join(b.dir(id), "disk.next")) {
		mount.Unmount(p)
		os.Remove(p)
	}
	os.Remove(filepath.Join(b.dir(id), "disk.next.img"))
}

// frozen reports whether the container's cgroup is frozen (paused).
func frozen(st containerState) bool {
	if dir, ok := st.CgroupPaths["freezer"]; ok {
		b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
		return err != nil || string(b) != "THAWED\n"
	}
	if dir, ok := st.CgroupPaths[""]; ok {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.freeze"))
		return err == nil && string(b) == "1\n"
	}
	return false
}

// resetCounters clears the peaks and counters a fresh cgroup starts with,
// so that the next episode cannot read the last one's from its cgroup.
func resetCounters(st containerState) {
	if dir, ok := st.CgroupPaths["memory"]; ok {
		for _, f := range []string{"memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes", "memory.failcnt", "memory.memsw.failcnt"} {
			os.WriteFile(filepath.Join(dir, f), []byte("0"), 0)
		}
	}
	if dir, ok := st.CgroupPaths["cpuacct"]; ok {
		os.WriteFile(filepath.Join(dir, "cpuacct.usage"), []byte("0"), 0)
	}
	if dir, ok := st.CgroupPaths[""]; ok {
		os.WriteFile(filepath.Join(dir, "memory.peak"), []byte("0"), 0)
	}
}

// restart resets a sandbox by restarting it: the container is stopped,
// its writable layer replaced by an empty one, and a new container started
// over the same, still-mounted layers.
func (b *Backend) restart(ctx context.Context, id string, rec *record) error {
	dir := b.dir(id)
	b.dropNextDisk(id)
	if err := b.runc.delete(ctx, id); err != nil {
		return fmt.Errorf("reset sandbox %s: %w", id, err)
	}
	if err := mount.Unmount(filepath.Join(dir, "rootfs")); err != nil {
		return fmt.Errorf("reset sandbox %s: %w", id, err)
	}
	// A fresh image is O(1) whatever the sandbox wrote, and gives its
	// blocks back to the node at once.
	if err := mount.Unmount(filepath.Join(dir, "disk")); err != nil {
		return fmt.Errorf("reset sandbox %s: %w", id, err)
	}
	if err := os.Remove(filepath.Join(dir, "disk.img")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("reset sandbox %s: %w", id, err)
	}
	if err := b.start(ctx, rec); err != nil {
		return fmt.Errorf("reset sandbox %s: %w", id, err)
	}
	// Its cgroup (and so its egress key) is new.
	return backend.WriteJSONFile(filepath.Join(dir, "sandbox.json"), rec)
}
