package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// SandboxLeaks lists what sandboxes of the server left behind: sandbox
// directories (with their sockets), mounts under the data dir, loop
// devices on its files, runc containers, cgroups under the server's cgroup
// parent, and processes in those cgroups. Empty means clean.
//
// While the server runs, the blank sandboxes of its node's pool, its
// spare memory cgroups and its pin of the shared sysfs's namespace are the
// node's, not a sandbox's, and are not counted (WithoutBlanks,
// WithoutSpares, WithoutNodeMounts); once it has stopped they are, so a
// stopped server must have drained its pool, removed its spares and
// unpinned.
func (s *Server) SandboxLeaks() []string {
	var leaks []string
	// A destroyed sandbox's directory is removed in the background from
	// the trash: there it is left until it is gone.
	for _, d := range []string{"sandboxes", "trash"} {
		dir := filepath.Join(s.DataDir, "edge", "container", d)
		if entries, err := os.ReadDir(dir); err == nil {
			for _, e := range entries {
				leaks = append(leaks, "directory "+filepath.Join(dir, e.Name()))
			}
		}
	}
	// A microVM's and a full VM's directory (a full VM's holds its disk
	// overlay) and VMM process.
	for _, kind := range []string{"microvm", "fullvm"} {
		vmDir := filepath.Join(s.DataDir, "edge", kind, "vms")
		if entries, err := os.ReadDir(vmDir); err == nil {
			for _, e := range entries {
				leaks = append(leaks, "directory "+filepath.Join(vmDir, e.Name()))
			}
		}
		leaks = append(leaks, vmProcesses(vmDir)...)
	}
	// The node's blobfs is the node's, not a sandbox's: it stays.
	blobfsMount := filepath.Join(s.DataDir, "edge", "blobfs", "mnt")
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], s.DataDir+"/") && f[4] != blobfsMount {
				leaks = append(leaks, "mount "+f[4])
			}
		}
	}
	if files, err := filepath.Glob("/sys/block/loop*/loop/backing_file"); err == nil {
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), s.DataDir+"/") {
				leaks = append(leaks, "loop device "+filepath.Base(filepath.Dir(filepath.Dir(f)))+" on "+strings.TrimSpace(string(b)))
			}
		}
	}
	runcRoot := filepath.Join(s.DataDir, "edge", "container", "runc")
	if out, err := exec.Command("runc", "--root", runcRoot, "list", "-q").Output(); err == nil {
		for _, id := range strings.Fields(string(out)) {
			leaks = append(leaks, "container "+id)
		}
	}
	for _, cg := range s.cgroupDirs() {
		entries, _ := os.ReadDir(cg)
		for _, e := range entries {
			if e.IsDir() {
				leaks = append(leaks, "cgroup "+filepath.Join(cg, e.Name()))
			}
		}
	}
	select {
	case <-s.done:
		return leaks
	default:
		return WithoutNodeMounts(WithoutSpares(WithoutBlanks(leaks, filepath.Join(s.DataDir, "edge", "container"))), filepath.Join(s.DataDir, "edge", "container"))
	}
}

// SysfsPin names the file in a container backend's root that pins the
// network namespace of the sysfs its sandboxes share (see
// internal/backend/container/sysfs.go).
const SysfsPin = "sysfs.net"

// WithoutNodeMounts drops from leaks the mounts a running edge keeps for
// all its sandboxes, whose container backend root is containerDir: the
// pin of their shared sysfs's network namespace. Once the edge has
// stopped it counts: Close removes it with the last sandbox.
func WithoutNodeMounts(leaks []string, containerDir string) []string {
	var out []string
	for _, l := range leaks {
		if l != "mount "+filepath.Join(containerDir, SysfsPin) {
			out = append(out, l)
		}
	}
	return out
}

// BlankPrefix names the blank sandboxes of a node's pool of containers
// (see internal/backend/container/pool.go).
const BlankPrefix = "pool-"

// SparePrefix names the emptied memory cgroups a node's container backend
// keeps for its next containers (see internal/backend/container/spare.go).
const SparePrefix = "spare-"

// WithoutSpares drops from leaks the cgroups a running edge keeps as
// spares: named SparePrefix… and holding no process. Once the edge has
// stopped they count: Close removes them.
func WithoutSpares(leaks []string) []string {
	var out []string
	for _, l := range leaks {
		if dir, ok := strings.CutPrefix(l, "cgroup "); ok && strings.HasPrefix(filepath.Base(dir), SparePrefix) {
			if procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil && len(procs) == 0 {
				continue
			}
		}
		out = append(out, l)
	}
	return out
}

// WithoutBlanks drops from leaks (lines ending in a path or id) those of
// the blank sandboxes a running edge keeps ready in its pool, whose
// container backend root is containerDir: a BlankPrefix… id whose
// sandbox directory exists. A blank's directory is made before anything
// else of it and removed after everything else, and the leaks are listed
// before this looks, so a blank starting or torn down meanwhile is not
// counted. What a claimed blank leaves is still counted: its directory
// and container carry the sandbox's id, and a cgroup2 cgroup that keeps
// the blank's name has no directory of that name.
func WithoutBlanks(leaks []string, containerDir string) []string {
	var out []string
	for _, l := range leaks {
		f := strings.Fields(l)
		// The id, or a path through its directory (a blank's writable
		// layer made ahead is mounted at …/pool-…/disk.next).
		id := ""
		for _, el := range strings.Split(f[len(f)-1], "/") {
			if strings.HasPrefix(el, BlankPrefix) {
				id = el
				break
			}
		}
		if id != "" {
			if st, err := os.Stat(filepath.Join(containerDir, "sandboxes", id)); err == nil && st.IsDir() {
				continue
			}
		}
		out = append(out, l)
	}
	return out
}

// vmProcesses lists live processes (VMMs) whose command line names a
// path under dir.
func vmProcesses(dir string) []string {
	var out []string
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(cmd), dir+"/") {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && strings.Contains(string(st), ") Z ") {
			continue
		}
		out = append(out, "process "+e.Name()+" "+strings.ReplaceAll(string(cmd[:min(len(cmd), 160)]), "\x00", " "))
	}
	return out
}

// cgroupDirs are the server's cgroup parent in every hierarchy.
func (s *Server) cgroupDirs() []string {
	var out []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, r := range roots {
		p := filepath.Join(r, s.CgroupParent)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// RequireNoSandboxLeft fails the test if the server's sandboxes left
// anything behind.
//
// Some teardown finishes in the kernel after the call that started it
// returned (a loop device with autoclear detaches after its last close; a
// cgroup empties as the last processes are reaped; a destroyed sandbox's
// directory waits in the trash until the edge removes it), so what is
// found is looked at again for a while before it counts as left behind.
func RequireNoSandboxLeft(t testing.TB, s *Server) {
	t.Helper()
	var leaks []string
	Poll(30*time.Second, func() error {
		if leaks = s.SandboxLeaks(); len(leaks) > 0 {
			return notYet{}
		}
		return nil
	})
	if len(leaks) > 0 {
		t.Fatalf("left behind:\n  %s", strings.Join(leaks, "\n  "))
	}
}
