package microvm

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
)

// Leaks lists what microVM sandboxes left under a backend root: sandbox
// directories (with their disks and sockets) and live processes whose
// command line names a path under root. Empty means clean. Tests use it.
func Leaks(root string) []string {
	var leaks []string
	vms := filepath.Join(root, "vms")
	if entries, err := os.ReadDir(vms); err == nil {
		for _, e := range entries {
			leaks = append(leaks, "directory "+filepath.Join(vms, e.Name()))
		}
	}
	procs, _ := os.ReadDir("/proc")
	needle := []byte(filepath.Clean(root) + "/")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(cmd, needle) && !isZombie(pid) {
			leaks = append(leaks, "process "+e.Name()+" "+string(bytes.ReplaceAll(cmd[:min(len(cmd), 200)], []byte{0}, []byte{' '})))
		}
	}
	return leaks
}
