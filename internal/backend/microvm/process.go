package microvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ProcessOf identifies the running process pid.
func ProcessOf(pid int) (Process, error) {
	start, err := processStart(pid)
	if err != nil {
		return Process{}, fmt.Errorf("process %d: %w", pid, err)
	}
	return Process{Pid: pid, Start: start}, nil
}

// Alive reports whether the process still runs (a zombie does not).
func (p Process) Alive() bool {
	if p.Pid <= 0 {
		return false
	}
	start, err := processStart(p.Pid)
	return err == nil && start == p.Start && !isZombie(p.Pid)
}

// Kill sends SIGKILL to the process, if it is still the one recorded, and
// waits until it has exited. It never signals a reused pid: the pid is
// pinned with a pidfd before its start time is checked.
func (p Process) Kill(ctx context.Context) error {
	if p.Pid <= 0 {
		return nil
	}
	fd, err := unix.PidfdOpen(p.Pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd of %d: %w", p.Pid, err)
	}
	defer unix.Close(fd)
	if start, err := processStart(p.Pid); err != nil || start != p.Start {
		return nil // not our process any more
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill %d: %w", p.Pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		// A pidfd polls readable once the process has exited, child of
		// ours or not.
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 50)
		if n > 0 {
			return nil
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for %d: %w", p.Pid, err)
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("process %d did not exit after SIGKILL", p.Pid)
		}
	}
}

// Wait returns when the process has exited or ctx ends.
func (p Process) Wait(ctx context.Context) error {
	fd, err := unix.PidfdOpen(p.Pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if !p.Alive() {
		return nil
	}
	for ctx.Err() == nil {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 100)
		if n > 0 {
			return nil
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
	}
	return ctx.Err()
}

func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command may contain spaces
	if i < 0 {
		return nil, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return nil, errors.New("malformed stat")
	}
	return f, nil
}

// processStart is field 22 of /proc/PID/stat: the start time in clock
// ticks since boot.
func processStart(pid int) (uint64, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(f[19], 10, 64)
}

func isZombie(pid int) bool {
	f, err := statFields(pid)
	return err == nil && (f[0] == "Z" || f[0] == "X")
}
