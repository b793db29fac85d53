package container

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/backend"
)

var _ backend.Recycler = (*Backend)(nil)

// baselines holds, by sandbox directory, the state fingerprint taken when
// the sandbox's container last started.
var baselines sync.Map // string → baseline

type baseline struct {
	initPid   int
	initStart uint64
	sum       [sha256.Size]byte
}

// Recycle implements backend.Recycler: a sandbox whose state is exactly as
// its container started — no process but its init; the same writable layer,
// the same tmpfs and mqueue mounts (every entry's name, type, owner, mode,
// size, mtime and ctime), the same SysV IPC objects — is left as it is;
// anything else is reset. Anything that cannot be checked counts as
// changed.
func (b *Backend) Recycle(ctx context.Context, id string) (bool, error) {
	if _, err := b.get(id); err != nil {
		return false, err
	}
	why := b.changed(id)
	if why == "" {
		return false, nil
	}
	b.log.DebugContext(ctx, "recycle: resetting", "sandbox", id, "why", why)
	if err := b.Reset(ctx, id); err != nil {
		return true, err
	}
	return true, nil
}

// changed says what changed in the sandbox since its baseline, or "".
func (b *Backend) changed(id string) string {
	v, ok := baselines.Load(b.dir(id))
	if !ok {
		return "no baseline"
	}
	base := v.(baseline)
	st, err := b.runc.readState(id)
	if err != nil {
		return "runc state: " + err.Error()
	}
	if st.InitPid != base.initPid || st.InitStart != base.initStart {
		return "another init"
	}
	if only, err := onlyInit(st); err != nil {
		return "processes: " + err.Error()
	} else if !only {
		return "processes besides init"
	}
	sum, err := b.fingerprint(id, st)
	if err != nil {
		return "fingerprint: " + err.Error()
	}
	if sum != base.sum {
		return "files or ipc"
	}
	return ""
}

// recordBaseline fingerprints a sandbox whose container just started.
// Without a baseline the next Recycle resets.
func (b *Backend) recordBaseline(id string) {
	st, err := b.runc.readState(id)
	if err != nil {
		return
	}
	sum, err := b.fingerprint(id, st)
	if err != nil {
		b.log.Debug("no recycle baseline", "sandbox", id, "err", err)
		baselines.Delete(b.dir(id))
		return
	}
	baselines.Store(b.dir(id), baseline{initPid: st.InitPid, initStart: st.InitStart, sum: sum})
}

func (b *Backend) forgetBaseline(id string) { baselines.Delete(b.dir(id)) }

// onlyInit reports whether the container's cgroup holds its init alone
// (its commands' child, cmdCgroup, included).
func onlyInit(st containerState) (bool, error) {
	dir := ""
	for _, k := range []string{"", "pids", "memory", "cpu", "freezer"} {
		if p, ok := st.CgroupPaths[k]; ok {
			dir = p
			break
		}
	}
	if dir == "" {
		return false, errors.New("no cgroup path")
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return false, err
	}
	if cmd, err := os.ReadFile(filepath.Join(dir, cmdCgroup, "cgroup.procs")); err == nil {
		b = append(append(b, '\n'), cmd...)
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err != nil || pid != st.InitPid {
			return false, nil
		}
	}
	return true, nil
}

// fingerprint hashes what a command can change in a sandbox without
// leaving a process behind: the writable layer, the container's writable
// tmpfs and mqueue mounts, and its SysV IPC objects.
func (b *Backend) fingerprint(id string, st containerState) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	h := sha256.New()
	if err := walk(h, b.upperDir(id), "upper"); err != nil {
		return sum, err
	}
	mounts, err := scratchMounts(st.InitPid)
	if err != nil {
		return sum, err
	}
	root := fmt.Sprintf("/proc/%d/root", st.InitPid)
	for _, m := range mounts {
		if err := walk(h, filepath.Join(root, m), "mount:"+m); err != nil {
			return sum, err
		}
	}
	ipc, err := sysvIPC(st.InitPid)
	if err != nil {
		return sum, err
	}
	h.Write(ipc)
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// scratchMounts lists the container's writable tmpfs and mqueue mount
// points, sorted.
func scratchMounts(pid int) ([]string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 6 || len(fields) < sep+2 {
			continue
		}
		fstype, opts := fields[sep+1], strings.Split(fields[5], ",")
		if (fstype == "tmpfs" || fstype == "mqueue") && !slices.Contains(opts, "ro") {
			out = append(out, fields[4])
		}
	}
	slices.Sort(out)
	return out, sc.Err()
}

// walk hashes a tree: every entry's path, type, mode, owner, size, device,
// mtime, ctime and link target, in name order, without following links or
// crossing into other mounts.
func walk(h hash.Hash, dir, label string) error {
	var top unix.Stat_t
	if err := unix.Lstat(dir, &top); err != nil {
		return err
	}
	var rec func(path, rel string) error
	rec = func(path, rel string) error {
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		var buf [8 * 9]byte
		for i, v := range []uint64{uint64(st.Mode), uint64(st.Uid), uint64(st.Gid), uint64(st.Size), st.Rdev,
			uint64(st.Mtim.Sec), uint64(st.Mtim.Nsec), uint64(st.Ctim.Sec), uint64(st.Ctim.Nsec)} {
			binary.LittleEndian.PutUint64(buf[i*8:], v)
		}
		h.Write([]byte(label + "/" + rel + "\x00"))
		h.Write(buf[:])
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			h.Write([]byte(target + "\x00"))
		case unix.S_IFDIR:
			if st.Dev != top.Dev {
				return nil // another mount: hashed on its own if it is scratch
			}
			entries, err := os.ReadDir(path)
			if err != nil {
				return err
			}
			for _, e := range entries { // sorted by name
				if err := rec(filepath.Join(path, e.Name()), rel+"/"+e.Name()); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return rec(dir, "")
}

// hostIPC is the edge's own IPC namespace, which a thread that read a
// container's goes back to.
var hostIPC = sync.OnceValues(func() (int, error) {
	return unix.Open("/proc/thread-self/ns/ipc", unix.O_RDONLY|unix.O_CLOEXEC, 0)
})

// sysvIPC reads the SysV shared memory segments, semaphore sets and message
// queues of the container's IPC namespace, from a thread that joins it and
// then goes back to the edge's. A thread that cannot go back is left locked
// and dies with its goroutine: it never serves the edge inside a
// container's namespace. Going back rather than letting every thread die
// saves creating one per fingerprint (milliseconds on a busy node).
func sysvIPC(pid int) ([]byte, error) {
	host, err := hostIPC()
	if err != nil {
		return nil, fmt.Errorf("the edge's ipc namespace: %w", err)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/ipc", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	type result struct {
		b   []byte
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(fd, unix.CLONE_NEWIPC); err != nil {
			ch <- result{err: fmt.Errorf("join ipc namespace: %w", err)}
			return // still locked: the thread's state is unknown
		}
		var r result
		for _, f := range []string{"shm", "sem", "msg"} {
			b, err := os.ReadFile("/proc/sysvipc/" + f)
			if err != nil {
				r = result{err: err}
				break
			}
			r.b = append(r.b, b...)
		}
		if err := unix.Setns(host, unix.CLONE_NEWIPC); err == nil {
			runtime.UnlockOSThread()
		}
		ch <- r
	}()
	r := <-ch
	return r.b, r.err
}
