package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dsec-project/dsec/internal/backend"
)

var _ backend.UsageReporter = (*Backend)(nil)

// cgroupRoot is where cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// Usage implements backend.UsageReporter: the CPU time and memory of the
// cgroup parent that holds every sandbox's cgroup, on cgroup v1 (cpuacct,
// memory controllers) or v2 (a unified hierarchy with cpu.stat). A parent
// that does not exist yet (no sandbox so far) uses nothing.
func (b *Backend) Usage(ctx context.Context) (backend.Usage, error) {
	var u backend.Usage
	parent := b.cfg.CgroupParent
	v1cpu := filepath.Join(cgroupRoot, "cpuacct", parent, "cpuacct.usage")
	if ns, err := readInt(v1cpu); err == nil {
		u.CPUSeconds = float64(ns) / 1e9
		if mem, err := readInt(filepath.Join(cgroupRoot, "memory", parent, "memory.usage_in_bytes")); err == nil {
			u.MemoryBytes = mem
		}
		return u, nil
	}
	v2 := filepath.Join(cgroupRoot, parent)
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		if b, err := os.ReadFile(filepath.Join(v2, "cpu.stat")); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
					us, _ := strconv.ParseInt(v, 10, 64)
					u.CPUSeconds = float64(us) / 1e6
				}
			}
		}
		if mem, err := readInt(filepath.Join(v2, "memory.current")); err == nil {
			u.MemoryBytes = mem
		}
		return u, nil
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cpuacct")); err == nil {
		return u, nil // v1 without our parent yet
	}
	return u, fmt.Errorf("container usage: no cgroup hierarchy found under %s", cgroupRoot)
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
