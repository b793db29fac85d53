package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-project/dsec/internal/mount"
)

// What the density benchmark reads of the host from /proc and /sys: it runs
// on the server's machine, as root.

// memAvailableKB is the host's MemAvailable.
func memAvailableKB() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			return strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}

// busyCPU is the CPU time the whole machine has spent working (user,
// nice, system, irq and softirq in /proc/stat; idle, I/O wait and time
// stolen by the hypervisor are not work), in clock ticks.
func busyCPU() (int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("malformed /proc/stat: %q", line)
	}
	var sum int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed /proc/stat: %q", line)
		}
		sum += n
	}
	return sum, nil
}

// restWait bounds how long settle waits for the machine to come to rest.
const restWait = 60 * time.Second

// settle waits, at most max, until sample finds the machine's CPUs busy
// for at most rest (a share, 0 to 1). After a batch of hundreds of
// sandboxes the machine stays busy for a while (the new agents' first
// collections, the kernel's DAMON scans of new memory, a host's own
// monitors walking a grown process table); a single timed then measures
// that backlog, not a create on a full node. It returns how long it
// waited, the last busy share, and whether the machine came to rest.
func settle(ctx context.Context, sample func(context.Context) (float64, error), rest float64, max time.Duration) (time.Duration, float64, bool) {
	t0 := time.Now()
	for {
		busy, err := sample(ctx)
		if err != nil {
			return time.Since(t0), 0, false
		}
		if waited := time.Since(t0); busy <= rest || waited >= max {
			return waited, busy, busy <= rest
		}
	}
}

// busyShare is the busy share of the machine's CPUs over the next second.
func busyShare(ctx context.Context) (float64, error) {
	b0, err := busyCPU()
	if err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(time.Second):
	}
	b1, err := busyCPU()
	if err != nil {
		return 0, err
	}
	// USER_HZ is 100: a second of one CPU is 100 ticks.
	return float64(b1-b0) / 100 / float64(runtime.NumCPU()), nil
}

// mountCount is the number of mounts in pid's mount namespace.
func mountCount(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return -1
	}
	return bytes.Count(b, []byte("\n"))
}

// mountsUnder counts the mounts under dir in pid's mount namespace: the
// node's own, whatever else runs on the machine.
func mountsUnder(pid int, dir string) int {
	if pid <= 0 || dir == "" {
		return -1
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return -1
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint ...
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			n++
		}
	}
	return n
}

// sameMountNS says whether pid shares the host's (pid 1's) mount namespace.
func sameMountNS(pid int) bool {
	a, err1 := os.Readlink("/proc/1/ns/mnt")
	if err1 != nil { // pid 1 hidden (a container, or ptrace rules): ours is the host's
		a, err1 = os.Readlink("/proc/self/ns/mnt")
	}
	b, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	return err1 == nil && err2 == nil && a == b
}

// rssKB is a process's resident set size.
func rssKB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			v, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return v
		}
	}
	return 0
}

// memcgDir is the directory of pid's memory cgroup, "" if unknown.
func memcgDir(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-id:controllers:path
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			return filepath.Join("/sys/fs/cgroup", f[2])
		case slices.Contains(strings.Split(f[1], ","), "memory"):
			return filepath.Join("/sys/fs/cgroup/memory", f[2])
		}
	}
	return ""
}

// memcgKB is what the memory cgroup at dir is charged:
// memory.usage_in_bytes on cgroup v1 (which counts kernel memory too),
// memory.current on v2. 0 if it cannot be read.
func memcgKB(dir string) int64 {
	for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
		if v, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
			return n >> 10
		}
	}
	return 0
}

// subdirs counts the directories in dir: the sandboxes' cgroups under
// the node's cgroup parent, blank ones of the pool included.
func subdirs(dir string) int {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		// The container backend's spare memory cgroups hold no container.
		if e.IsDir() && !strings.HasPrefix(e.Name(), "spare-") {
			n++
		}
	}
	return n
}

// sandboxProcs maps each of ids that has processes on this host to them,
// found by their cgroup (a sandbox's cgroups are named after it, a
// claimed blank's renamed to it) or else by the DSEC_SANDBOX_ID=<id> the
// container backend puts in the environment of every sandbox process (a
// claimed blank's agent keeps its blank's). One pass over /proc.
func sandboxProcs(ids map[string]bool) map[string][]int {
	out := map[string][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if id := sandboxOf(e.Name(), ids); id != "" {
			out[id] = append(out[id], pid)
		}
	}
	return out
}

// sandboxOf is which of ids process pid belongs to, or "".
func sandboxOf(pid string, ids map[string]bool) string {
	if cg, err := os.ReadFile("/proc/" + pid + "/cgroup"); err == nil {
		for _, line := range strings.Split(string(cg), "\n") {
			// hierarchy-ID:controllers:path
			if f := strings.SplitN(line, ":", 3); len(f) == 3 {
				for _, name := range strings.Split(f[2], "/") {
					if ids[name] {
						return name
					}
				}
			}
		}
	}
	env, err := os.ReadFile("/proc/" + pid + "/environ")
	if err != nil {
		return ""
	}
	for _, kv := range bytes.Split(env, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("DSEC_SANDBOX_ID=")); ok {
			if ids[string(v)] {
				return string(v)
			}
			return ""
		}
	}
	return ""
}

// listenerPid finds the process listening at addr: a URL (http://host:port
// or unix:///path). It returns 0 if none is found on this host.
func listenerPid(addr string) int {
	u, err := url.Parse(addr)
	if err != nil {
		return 0
	}
	var inodes map[string]bool
	switch u.Scheme {
	case "unix":
		inodes = unixInodes(u.Path)
	case "http", "https":
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		p, _ := strconv.Atoi(port)
		inodes = tcpListenInodes(p)
	}
	if len(inodes) == 0 {
		return 0
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir("/proc/" + e.Name() + "/fd")
		for _, fd := range fds {
			l, err := os.Readlink("/proc/" + e.Name() + "/fd/" + fd.Name())
			if err == nil && strings.HasPrefix(l, "socket:[") && inodes[strings.TrimSuffix(l[len("socket:["):], "]")] {
				return pid
			}
		}
	}
	return 0
}

func tcpListenInodes(port int) map[string]bool {
	out := map[string]bool{}
	hex := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fl := strings.Fields(line)
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
			if len(fl) > 9 && strings.HasSuffix(fl[1], hex) && fl[3] == "0A" {
				out[fl[9]] = true
			}
		}
	}
	return out
}

func unixInodes(path string) map[string]bool {
	out := map[string]bool{}
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode Path
		fl := strings.Fields(sc.Text())
		if len(fl) >= 8 && fl[7] == path {
			out[fl[6]] = true
		}
	}
	return out
}

// dataDirOf guesses the data directory of a dsec server or edge from its
// command line (--data), relative to its working directory, with the
// defaults of `dsec server` (DSEC_DATA, then .dsec) and `dsec edge`.
// Returns the directory a node keeps its sandboxes under.
func dataDirOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	isEdge := len(args) > 1 && args[1] == "edge"
	dir := ""
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, "data="); ok {
			dir = v
		} else if a == "data" && i+1 < len(args) && strings.HasPrefix(args[i], "-") {
			dir = args[i+1]
		}
	}
	if dir == "" {
		switch {
		case isEdge:
			dir = "/var/lib/dsec-edge"
		default:
			dir = ".dsec"
			if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil {
				for _, kv := range strings.Split(string(env), "\x00") {
					if v, ok := strings.CutPrefix(kv, "DSEC_DATA="); ok && v != "" {
						dir = v
					}
				}
			}
		}
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(cwd, dir)
	}
	if !isEdge {
		dir = filepath.Join(dir, "edge")
	}
	return dir
}

// leftovers lists what still names one of ids on this host: mounts in the
// host's and the edge's mount namespaces, cgroups, processes, and files
// under the node's sandbox directories.
func leftovers(ids map[string]bool, edgePid int, dataDir string) []string {
	var out []string
	named := func(s string) string {
		for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == '/' || r == ' ' || r == '\t' }) {
			for id := range ids {
				if strings.Contains(part, id) {
					return id
				}
			}
		}
		return ""
	}
	pids := []int{1}
	if edgePid > 0 && !sameMountNS(edgePid) {
		pids = append(pids, edgePid)
	}
	for _, pid := range pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		for _, line := range strings.Split(string(b), "\n") {
			if id := named(line); id != "" {
				out = append(out, fmt.Sprintf("mount (ns of pid %d): %s", pid, line))
			}
		}
	}
	filepath.WalkDir("/sys/fs/cgroup", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if id := named(filepath.Base(p)); id != "" {
			out = append(out, "cgroup: "+p)
			return filepath.SkipDir
		}
		return nil
	})
	for id, ps := range sandboxProcs(ids) {
		out = append(out, fmt.Sprintf("processes of %s: %v", id, ps))
	}
	if dataDir != "" {
		for _, sub := range []string{"container", "microvm"} {
			filepath.WalkDir(filepath.Join(dataDir, sub), func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return nil
				}
				if id := named(d.Name()); id != "" {
					out = append(out, "file: "+p)
					if d.IsDir() {
						return filepath.SkipDir
					}
				}
				// Layer mounts hold whole root filesystems: not ours to walk.
				if d.IsDir() {
					if ok, _ := mount.IsMountpoint(p); ok {
						return filepath.SkipDir
					}
				}
				return nil
			})
		}
	}
	return out
}

// kernelKB is the host's kernel memory that is not reclaimable (slab that
// cannot be shrunk, kernel stacks, page tables, per-cpu data).
func kernelKB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var sum int64
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "SUnreclaim", "KernelStack", "PageTables", "Percpu":
			if f := strings.Fields(rest); len(f) > 0 {
				v, _ := strconv.ParseInt(f[0], 10, 64)
				sum += v
			}
		}
	}
	return sum
}
