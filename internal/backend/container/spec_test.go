package container

import (
	"slices"
	"testing"

	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/idmap"
)

// TestAgentStartsWithOneP: the agent is started with GOMAXPROCS=1 (an
// idle agent that starts with a P per core and cuts to one keeps up to
// ~0.5 MiB more) and told that the variable is its own, to unset before
// any command inherits it; a sandbox's own GOMAXPROCS is left alone.
func TestAgentStartsWithOneP(t *testing.T) {
	args := []string{agentPath, "--listen-fd", "3"}
	s, err := ociSpec(backend.Spec{ID: "sb-a"}, idmap.Range{Base: 1 << 20}, "/rootfs", "/dsec/sb-a", "/runtime", sandboxFS{}, args)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Process.Env, "GOMAXPROCS=1") || !slices.Contains(s.Process.Args, "--own-gomaxprocs") {
		t.Fatalf("agent env %q args %q: want GOMAXPROCS=1 and --own-gomaxprocs", s.Process.Env, s.Process.Args)
	}
	if len(args) != 3 {
		t.Fatalf("ociSpec changed its caller's args: %q", args)
	}

	s, err = ociSpec(backend.Spec{ID: "sb-b", Env: map[string]string{"GOMAXPROCS": "4"}}, idmap.Range{Base: 1 << 20}, "/rootfs", "/dsec/sb-b", "/runtime", sandboxFS{}, args)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(s.Process.Env, "GOMAXPROCS=1") || !slices.Contains(s.Process.Env, "GOMAXPROCS=4") || slices.Contains(s.Process.Args, "--own-gomaxprocs") {
		t.Fatalf("sandbox with GOMAXPROCS=4: agent env %q args %q", s.Process.Env, s.Process.Args)
	}
}

// TestSysMounts: /sys is the shared sysfs when there is one, and the cgroup
// v1 hierarchies are binds of the container's own cgroups over the runtime
// layer's skeleton, in the order runc must make them (a mount point before
// what is mounted on it); with neither, runc's own mounts.
func TestSysMounts(t *testing.T) {
	got := func(fs sandboxFS) []string {
		var out []string
		for _, m := range fs.sysMounts("/runtime", "/dsec/sb-a") {
			out = append(out, m.Destination+" "+m.Type+" "+m.Source)
			if !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "nosuid") || !slices.Contains(m.Options, "nodev") || !slices.Contains(m.Options, "noexec") {
				t.Errorf("%s mounted %q: want ro, nosuid, nodev, noexec", m.Destination, m.Options)
			}
		}
		return out
	}
	for _, c := range []struct {
		fs   sandboxFS
		want []string
	}{
		{sandboxFS{}, []string{"/sys sysfs sysfs", "/sys/fs/cgroup cgroup cgroup"}},
		{sandboxFS{sysfs: "/edge/sysfs", cgroups: v1Hierarchies{dirs: []string{"cpu,cpuacct", "memory"}, links: map[string]string{"cpu": "cpu,cpuacct"}}}, []string{
			"/sys bind /edge/sysfs",
			"/sys/fs/cgroup bind /runtime/.dsec/cgroup",
			"/sys/fs/cgroup/cpu,cpuacct bind /sys/fs/cgroup/cpu,cpuacct/dsec/sb-a",
			"/sys/fs/cgroup/memory bind /sys/fs/cgroup/memory/dsec/sb-a",
		}},
	} {
		if g := got(c.fs); !slices.Equal(g, c.want) {
			t.Errorf("sysMounts(%+v):\n%q\nwant\n%q", c.fs, g, c.want)
		}
	}
}
