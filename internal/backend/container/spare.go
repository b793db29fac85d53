package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// spares keeps the emptied memory cgroups of stopped containers for the
// next containers to start in, instead of removing one and making another.
//
// A memory cgroup is the one cgroup whose life costs grow with the node
// (docs/ARCHITECTURE.md, "Memory cgroups outlive their sandbox"): making
// one allocates a slot for every shrinker id the host has used at once —
// one per superblock, so ~n·s/64 KiB on a node of n sandboxes with s
// superblocks each — and removing one walks every superblock's lists under
// the global mutex that every mount, and the cgroup mutex that every
// cgroup write, waits for. A spare is renamed (cgroup v1 renames only
// within a parent), so it lives beside the sandboxes' cgroups as
// spare-<n>; runc, finding a container's memory cgroup already there,
// uses it.
//
// Only cgroup v1's memory hierarchy has them: it is the one this node's
// sandboxes use, and v1 lets the counters a tenant could read be reset.
type spares struct {
	dir string // <memory hierarchy>/<cgroup parent>; "" when off
	max int

	mu   sync.Mutex
	free []string // names under dir, oldest first
	seq  uint64
}

const sparePrefix = "spare-"

// newSpares keeps up to max spares under the cgroup parent of cgroup v1's
// memory hierarchy, after removing any an earlier run of the backend left.
// With max 0 or no v1 memory hierarchy it keeps none.
func newSpares(parent string, max int) *spares {
	dir := filepath.Join(cgroupRoot, "memory", parent)
	if max <= 0 {
		return &spares{}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "memory.force_empty")); err != nil {
		return &spares{}
	}
	s := &spares{dir: dir, max: max}
	s.removeLeftovers()
	return s
}

// isSpare reports whether a cgroup's name is a spare's.
func isSpare(name string) bool { return strings.HasPrefix(name, sparePrefix) }

// put keeps dir — a container's memory cgroup under the parent, with no
// process left in it — as a spare. It returns false when it does not (not
// the parent's, spares full, or the rename failed), and dir is then the
// caller's to remove.
func (s *spares) put(dir string) bool {
	if s == nil || s.dir == "" || filepath.Dir(dir) != s.dir {
		return false
	}
	if procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err != nil || len(procs) > 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.free) >= s.max {
		return false
	}
	s.seq++
	name := sparePrefix + strconv.FormatUint(s.seq, 10)
	if err := unix.Rename(dir, filepath.Join(s.dir, name)); err != nil {
		return false
	}
	s.free = append(s.free, name)
	return true
}

// take makes a spare, emptied, unlimited and with its counters cleared,
// the memory cgroup named name under the parent, for the container of
// that name to start in. It returns false when there is none (runc then
// makes the cgroup).
func (s *spares) take(name string) bool {
	if s == nil || s.dir == "" {
		return false
	}
	for {
		s.mu.Lock()
		if len(s.free) == 0 {
			s.mu.Unlock()
			return false
		}
		spare := s.free[0]
		s.free = s.free[1:]
		s.mu.Unlock()
		dir := filepath.Join(s.dir, spare)
		if err := clearMemcg(dir); err == nil && unix.Rename(dir, filepath.Join(s.dir, name)) == nil {
			return true
		}
		unix.Rmdir(dir)
	}
}

// spareKeep is the most a spare carries to its next tenant: a quarter of
// the least memory a sandbox may have (16 MiB).
const spareKeep = 4 << 20

// clearMemcg readies an emptied memory cgroup for a new tenant: it drops
// the limits, trims what is still charged to it to spareKeep, and clears
// the peaks and failure counts. What v1 cannot clear is left: memory.stat's
// event totals (page faults, pages in and out) and the OOM-kill count in
// memory.oom_control.
//
// What a stopped sandbox leaves charged is mostly page cache of files it
// was the first to read — its layers' and the agent's binary, which the
// node's other sandboxes share and keep hot — and a few KiB of kernel
// objects. Reclaiming all of it (memory.force_empty) evicted those shared
// pages for every tenant, so the next one faulted them back from disk and
// was charged for them again (~2 MiB of the agent's binary per create,
// measured), and it spent ~16 passes of reclaim on the kernel objects it
// cannot free. Lowering the limit instead reclaims only what is above it,
// oldest first, and not at all for an idle sandbox's leftovers; a spare
// that cannot be brought down to it (the kernel answers EBUSY) is not
// used.
func clearMemcg(dir string) error {
	if procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err != nil || len(procs) > 0 {
		return errors.New("memory cgroup in use")
	}
	// The memory limit may not exceed memory+swap's: raise that first.
	for _, kv := range [][2]string{
		{"memory.memsw.limit_in_bytes", "-1"},
		{"memory.limit_in_bytes", "-1"},
		{"memory.soft_limit_in_bytes", "-1"},
	} {
		if err := os.WriteFile(filepath.Join(dir, kv[0]), []byte(kv[1]), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	usage, err := os.ReadFile(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return err
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(string(usage)), 10, 64); err != nil || n > spareKeep {
		limit := filepath.Join(dir, "memory.limit_in_bytes")
		if err := os.WriteFile(limit, []byte(strconv.Itoa(spareKeep)), 0); err != nil {
			return fmt.Errorf("trim the spare to %d bytes: %w", spareKeep, err)
		}
		if err := os.WriteFile(limit, []byte("-1"), 0); err != nil {
			return err
		}
	}
	for _, f := range []string{"memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes", "memory.kmem.max_usage_in_bytes",
		"memory.failcnt", "memory.memsw.failcnt", "memory.kmem.failcnt"} {
		os.WriteFile(filepath.Join(dir, f), []byte("0"), 0)
	}
	return nil
}

// len returns how many spares are kept.
func (s *spares) len() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.free)
}

// removeAll removes every spare: at Close, so that nothing of the backend
// outlives it.
func (s *spares) removeAll() {
	if s == nil || s.dir == "" {
		return
	}
	s.mu.Lock()
	free := s.free
	s.free = nil
	s.mu.Unlock()
	for _, name := range free {
		unix.Rmdir(filepath.Join(s.dir, name))
	}
}

// removeLeftovers removes the spares of a backend that did not close.
func (s *spares) removeLeftovers() {
	entries, _ := os.ReadDir(s.dir)
	for _, e := range entries {
		if e.IsDir() && isSpare(e.Name()) {
			unix.Rmdir(filepath.Join(s.dir, e.Name()))
		}
	}
}
