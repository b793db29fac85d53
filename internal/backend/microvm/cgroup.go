package microvm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cpuCgroups caps the host CPU time of VMM processes, as the container
// backend's cgroups cap containers': a sandbox that asked for 0.5 CPU gets
// one vCPU that runs at most half the time. It works on cgroup v2 and on
// the cpu controller of cgroup v1.
type cpuCgroups struct {
	root string // the cpu hierarchy's mount point
	v2   bool
}

const cpuPeriod = 100000 // µs

// findCPUCgroups finds the hierarchy that has the cpu controller.
func findCPUCgroups() (*cpuCgroups, error) {
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && slices.Contains(strings.Fields(string(b)), "cpu") {
		return &cpuCgroups{root: "/sys/fs/cgroup", v2: true}, nil
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ... mountpoint ... - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, opts := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(opts) < 3 || opts[0] != "cgroup" {
			continue
		}
		if slices.Contains(strings.Split(opts[2], ","), "cpu") {
			return &cpuCgroups{root: fields[4]}, nil
		}
	}
	return nil, errors.New("no cgroup hierarchy with the cpu controller")
}

func (c *cpuCgroups) dir(parent, id string) string { return filepath.Join(c.root, parent, id) }

// place moves pid into the cgroup parent/id, capped at cpu cores.
func (c *cpuCgroups) place(parent, id string, pid int, cpu float64) error {
	dir := c.dir(parent, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cgroup %s: %w", dir, err)
	}
	quota := int64(cpu * cpuPeriod)
	if c.v2 {
		for _, d := range []string{c.root, filepath.Join(c.root, parent)} {
			os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+cpu"), 0)
		}
		if err := os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(fmt.Sprintf("%d %d", quota, cpuPeriod)), 0); err != nil {
			return fmt.Errorf("cgroup %s: cpu.max: %w", dir, err)
		}
	} else {
		if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(cpuPeriod)), 0); err != nil {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(quota, 10)), 0); err != nil {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("cgroup %s: move %d: %w", dir, pid, err)
	}
	return nil
}

// remove deletes the cgroup of a VM whose process is gone, retrying while
// its last threads finish exiting.
func (c *cpuCgroups) remove(parent, id string) error {
	dir := c.dir(parent, id)
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
