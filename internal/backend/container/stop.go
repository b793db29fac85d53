package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// containerState is the part of runc's own state file we read directly,
// without starting a runc process.
type containerState struct {
	InitPid     int               `json:"init_process_pid"`
	InitStart   uint64            `json:"init_process_start"`
	CgroupPaths map[string]string `json:"cgroup_paths"`
}

func (r runc) readState(id string) (containerState, error) {
	var st containerState
	b, err := os.ReadFile(filepath.Join(r.root, id, "state.json"))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("runc state of %s: %w", id, err)
	}
	return st, nil
}

// stop kills the container's init — and with it every process of its PID
// namespace — and waits until it has exited. It does what `runc delete
// --force` does for a running container but without runc's fixed 100 ms
// polling sleep, so that a following `runc delete` finds the container
// stopped and returns at once. The pid is checked against the start time
// runc recorded, through a pidfd, so a reused pid is never signalled.
func (r runc) stop(ctx context.Context, id string, st containerState) error {
	fd, err := unix.PidfdOpen(st.InitPid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd of %s: %w", id, err)
	}
	defer unix.Close(fd)
	if start, err := processStart(st.InitPid); err != nil || start != st.InitStart {
		return nil // not our process any more
	}
	thaw(st.CgroupPaths) // a frozen process cannot die
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill %s: %w", id, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 100)
		if n > 0 {
			return nil
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for %s: %w", id, err)
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("container %s did not exit after SIGKILL", id)
		}
	}
}

// thaw unfreezes a paused container's cgroup, on v1 or v2.
func thaw(paths map[string]string) {
	if dir, ok := paths["freezer"]; ok {
		os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
	}
	if dir, ok := paths[""]; ok {
		os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0)
	}
}

// removeCgroups removes a stopped container's cgroups, retrying while the
// last processes of its PID namespace finish exiting. The commands' cpu
// cgroup (cmdCgroup) goes first: a cgroup with a child cannot be removed.
// Its memory cgroup, once empty, goes to the spares if they take it.
func (r runc) removeCgroups(paths map[string]string) error {
	deadline := time.Now().Add(5 * time.Second)
	var dirs []string
	for _, dir := range paths {
		dirs = append(dirs, filepath.Join(dir, cmdCgroup), dir)
	}
	for _, dir := range dirs {
		for {
			if dir == paths["memory"] && r.spares.put(dir) {
				break
			}
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("remove cgroup %s: %w", dir, err)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// processStart is field 22 of /proc/PID/stat: the start time in clock
// ticks, which runc records as init_process_start.
func processStart(pid int) (uint64, error) {
	v, err := statField(pid, 22)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(v, 10, 64)
}

// statField returns field n (counted from 1, as in proc(5)) of
// /proc/PID/stat, for a field after the command's name.
func statField(pid, n int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command may contain spaces
	if i < 0 {
		return "", errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:]) // from field 3 on
	if n < 3 || len(f) < n-2 {
		return "", errors.New("malformed stat")
	}
	return f[n-3], nil
}

// protectAgent makes the agent the sandbox's last choice for the OOM
// killer: a memory bomb inside kills the bomb, not the agent that reports
// it. Only root outside can lower the score.
func (r runc) protectAgent(id string) {
	if st, err := r.readState(id); err == nil {
		os.WriteFile("/proc/"+strconv.Itoa(st.InitPid)+"/oom_score_adj", []byte("-998"), 0)
	}
}
