package container

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// waitStray waits for runc commands on this state root that a previous
// edge left behind: killed while runc was creating a container, the edge
// leaves runc running on its own (in its own session, by design), and what
// it creates could appear after recovery looked and leak. Commands still
// running after timeout are killed.
func (r runc) waitStray(ctx context.Context, timeout time.Duration) (waited bool) {
	deadline := time.Now().Add(timeout)
	for {
		pids := r.stray()
		if len(pids) == 0 {
			return waited
		}
		waited = true
		if time.Now().After(deadline) || ctx.Err() != nil {
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(50 * time.Millisecond)
			return waited
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stray lists the processes of runc commands on this state root that are
// not this process's own: the pool starts blanks from the moment the
// backend is made, and its runc commands, children of this process, are
// not a previous edge's.
func (r runc) stray() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		args := bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0})
		if filepath.Base(string(args[0])) != filepath.Base(r.bin) {
			continue
		}
		for i := 1; i+1 < len(args); i++ {
			if string(args[i]) == "--root" && string(args[i+1]) == r.root {
				if ppid, err := parentPid(pid); err == nil && ppid != self {
					pids = append(pids, pid)
				}
				break
			}
		}
	}
	return pids
}

// parentPid is field 4 of /proc/PID/stat.
func parentPid(pid int) (int, error) {
	v, err := statField(pid, 4)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}
