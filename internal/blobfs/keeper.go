package blobfs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// AdoptEnv names the environment variable that makes a new keeper take
// over the FUSE connection of a worker whose keeper died (its pid), instead
// of mounting anew: the mount, and every EROFS mount over it, lives on.
const AdoptEnv = "DSEC_BLOBFS_ADOPT"

// workerFD is the fd a worker serves the FUSE connection on (FDEnv).
const workerFD = 3

// Keep is the keeper: it mounts a blobfs at MountDir(dir), holds its
// /dev/fuse fd and runs worker (a command that calls Work) with the fd
// inherited as fd 3, starting it again whenever it dies, until the file
// system is unmounted (a worker exits 0 only then). When ctx ends it
// unmounts if nothing uses the mount and otherwise serves on.
//
// With adopt, the pid of a worker whose keeper died, it takes that
// worker's connection instead of mounting (pidfd_getfd): a worker outlives
// its keeper and holds the connection open meanwhile, so a keeper killed
// and started again (Supervise) costs the mount nothing. The adopted
// worker serves on until it dies; then the keeper starts its own. If the
// connection cannot be taken (the worker died too: the connection ended
// with its last fd), the keeper mounts anew.
func Keep(ctx context.Context, dir string, worker []string, adopt int, log *slog.Logger) error {
	mp := MountDir(dir)
	var fuseFile *os.File
	adopted := -1 // pidfd of the adopted worker
	if adopt > 0 {
		f, pidfd, err := adoptConn(adopt)
		if err != nil {
			log.Warn("blobfs: cannot take over the FUSE connection of the last keeper's worker; mounting anew", "worker", adopt, "err", err)
		} else {
			fuseFile, adopted = f, pidfd
			log.Info("blobfs: took over the FUSE connection of the last keeper's worker", "worker", adopt)
		}
	}
	if fuseFile == nil {
		cleanStale(mp) // before the mkdir: a dead mount fails it
		if err := os.MkdirAll(mp, 0o700); err != nil {
			return err
		}
		fd, err := mountFUSE(mp)
		if err != nil {
			return err
		}
		fuseFile = os.NewFile(uintptr(fd), "/dev/fuse")
	}
	defer fuseFile.Close()
	if err := os.WriteFile(pidPath(dir), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		if adopted >= 0 {
			unix.Close(adopted)
		} else {
			unix.Unmount(mp, unix.MNT_DETACH)
		}
		return err
	}
	defer os.Remove(pidPath(dir))
	defer os.Remove(WorkerPidPath(dir))
	if adopted >= 0 {
		ctx = waitAdopted(ctx, adopted, mp, log)
		unix.Close(adopted)
		if !mounted(mp) {
			log.Info("blobfs unmounted")
			return nil
		}
		log.Warn("blobfs worker died; starting another on the same mount")
	}
	// Workers outlive the keeper (no Pdeathsig): a worker holds the
	// connection open until a new keeper adopts it.
	backoff := 10 * time.Millisecond
	for {
		cmd := exec.Command(worker[0], worker[1:]...)
		cmd.Env = append(os.Environ(), FDEnv+"="+strconv.Itoa(workerFD), AdoptEnv+"=")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		cmd.ExtraFiles = []*os.File{fuseFile}
		started := time.Now()
		if err := cmd.Start(); err != nil {
			unix.Unmount(mp, unix.MNT_DETACH)
			return fmt.Errorf("start blobfs worker: %w", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var werr error
	wait:
		for {
			select {
			case werr = <-exited:
				break wait
			case <-ctx.Done():
				// Unmount if unused; the worker then sees the connection
				// end and exits 0.
				if err := unix.Unmount(mp, 0); err != nil {
					log.Warn("blobfs still in use; serving on", "err", err)
				}
				ctx = context.Background()
			}
		}
		if werr == nil {
			log.Info("blobfs unmounted")
			return nil
		}
		// A worker killed by a signal is started again at once; one that
		// fails by itself soon after its start backs off (a crash loop).
		delay := 10 * time.Millisecond
		var exitErr *exec.ExitError
		if errors.As(werr, &exitErr) && !exitErr.Sys().(syscall.WaitStatus).Signaled() {
			if time.Since(started) > 10*time.Second {
				backoff = 10 * time.Millisecond
			}
			delay = backoff
			backoff = min(backoff*2, time.Second)
		}
		log.Warn("blobfs worker died; starting another on the same mount", "err", werr, "after", delay)
		time.Sleep(delay)
	}
}

// adoptConn takes a copy of the FUSE connection fd of worker pid.
func adoptConn(pid int) (*os.File, int, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	fd, err := unix.PidfdGetfd(pidfd, workerFD, 0)
	if err != nil {
		unix.Close(pidfd)
		return nil, -1, fmt.Errorf("pidfd_getfd %d/%d: %w", pid, workerFD, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 10 || unix.Minor(st.Rdev) != 229 {
		unix.Close(fd)
		unix.Close(pidfd)
		return nil, -1, fmt.Errorf("fd %d of process %d is not /dev/fuse", workerFD, pid)
	}
	return os.NewFile(uintptr(fd), "/dev/fuse"), pidfd, nil
}

// waitAdopted waits for the adopted worker (pidfd) to end. When ctx ends
// first it unmounts mp if unused, as the keeper's own loop does; it
// returns the context the keeper goes on with.
func waitAdopted(ctx context.Context, pidfd int, mp string, log *slog.Logger) context.Context {
	for !waitPidfd(ctx, pidfd) {
		if err := unix.Unmount(mp, 0); err != nil {
			log.Warn("blobfs still in use; serving on", "err", err)
		}
		ctx = context.Background()
	}
	return ctx
}

// waitPidfd waits until the process of pidfd ends (true) or ctx does.
func waitPidfd(ctx context.Context, pidfd int) bool {
	for ctx.Err() == nil {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 200)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return true // cannot watch it: take it as gone
		}
		if n > 0 {
			return true
		}
	}
	return false
}

// mounted reports whether mp is a mount point of a FUSE file system. It
// asks /proc, not the file system: with no worker serving it, a statfs
// would wait.
func mounted(mp string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[4] != mp {
			continue
		}
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) && strings.HasPrefix(fields[i+1], "fuse") {
				return true
			}
		}
	}
	return false
}

// running reports whether process pid runs (a zombie, dead but not yet
// reaped by whoever inherited it, does not).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// isBlobfs reports whether process pid runs a blobfs command line.
func isBlobfs(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && strings.Contains(string(b), "blobfs")
}

// readPid reads a pid file; 0 if there is none.
func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// Supervise keeps a keeper running for dir while ctx lasts: when the
// keeper dies (kill -9, a crash) it starts another, `argv...` with env as
// EnsureDaemon does, which adopts the connection of the worker the dead
// keeper left serving, so the mount and every layer mounted over it stay.
// If the worker is gone too, the connection ended with it: the new keeper
// mounts anew (new mounts work; a sandbox whose layers were mounted over
// the old connection reads EIO from what its page cache does not hold
// until it is recreated). Cancel ctx before StopDaemon, or the stopped
// blobfs is started again.
func Supervise(ctx context.Context, dir string, argv []string, env []string, log *slog.Logger) {
	failures := 0
	for ctx.Err() == nil {
		// A stale pid file's pid may be another process's by now.
		if pid := readPid(pidPath(dir)); pid > 0 && isBlobfs(pid) {
			if pidfd, err := unix.PidfdOpen(pid, 0); err == nil {
				waitPidfd(ctx, pidfd)
				unix.Close(pidfd)
				if ctx.Err() != nil {
					return
				}
			}
		}
		keeperEnv := env
		if w := readPid(WorkerPidPath(dir)); w > 0 && running(w) {
			keeperEnv = append(append([]string(nil), env...), AdoptEnv+"="+strconv.Itoa(w))
			log.WarnContext(ctx, "blobfs keeper died; starting another to adopt its worker", "dir", dir, "worker", w)
		} else {
			log.WarnContext(ctx, "blobfs keeper and worker died; mounting blobfs anew (layers mounted over the old mount read EIO)", "dir", dir)
			cleanStale(MountDir(dir))
		}
		if err := startDaemon(ctx, dir, argv, keeperEnv, log); err != nil {
			failures++
			log.ErrorContext(ctx, "blobfs keeper restart failed", "dir", dir, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(min(time.Duration(failures)*time.Second, 10*time.Second)):
			}
			continue
		}
		failures = 0
	}
}
