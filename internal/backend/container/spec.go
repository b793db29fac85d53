package container

import (
	"maps"
	"path/filepath"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/idmap"
)

// agentPath is where the agent binary appears inside every sandbox, from
// the runtime layer under the base.
const agentPath = "/.dsec/dsec-agent"

// defaultCaps is Docker's default capability set without CAP_NET_RAW:
// raw and packet sockets would let a sandbox forge frames on the bridge
// and send packets the socket-level egress hooks never see. Capabilities
// are those of the sandbox's own user namespace.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// runc's defaults: paths masked or made read-only in /proc and /sys. The
// masked directories (agent.MaskedDirs) are the agent's to mask, with
// binds of one empty directory rather than a tmpfs each (see
// agent.FinishContainer).
var (
	maskedPaths = []string{
		"/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// ociVersion is the runtime-spec version runc 1.1 (Debian 12) speaks; the
// fields we use are all in it.
const ociVersion = "1.0.2"

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ociSpec is the runtime spec of a sandbox's container. It has no seccomp
// section: the agent (args) loads the node's precompiled filters itself
// before it serves anything (see filters), from runtime's .dsec, which is
// bound read-only at /.dsec.
func ociSpec(sb backend.Spec, ids idmap.Range, rootfs, cgroupsPath, runtime string, fs sandboxFS, args []string) (*specs.Spec, error) {
	envList := sandboxEnv(sb)
	if _, set := sb.Env["GOMAXPROCS"]; !set {
		// For the agent alone (it unsets it at once): one P from its
		// first instruction keeps an idle agent smaller (see
		// cmd/dsec-agent). A GOMAXPROCS of the sandbox's own is left to
		// the agent and its commands, as before.
		envList = append(envList, "GOMAXPROCS=1")
		args = append(slices.Clip(args), "--own-gomaxprocs")
	}
	s := &specs.Spec{
		Version:  ociVersion,
		Hostname: sb.ID,
		Root:     &specs.Root{Path: rootfs},
		Process: &specs.Process{
			Args: args,
			Env:  envList,
			Cwd:  "/",
			User: specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  agentCaps,
				Effective: agentCaps,
				Permitted: agentCaps,
			},
			NoNewPrivileges: true,
			// No Rlimits: raising them is not permitted on every host, and
			// the ones inherited are sane.
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: cgroupsPath,
			Resources:   resources(sb.Resources),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
				{Type: specs.UserNamespace},
			},
			// Root inside is ids.Base outside, unique to this sandbox.
			UIDMappings:   []specs.LinuxIDMapping{{ContainerID: 0, HostID: ids.Base, Size: idmap.Size}},
			GIDMappings:   []specs.LinuxIDMapping{{ContainerID: 0, HostID: ids.Base, Size: idmap.Size}},
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
	s.Mounts = append(s.Mounts, fs.sysMounts(runtime, cgroupsPath)...)
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/.dsec", Type: "bind", Source: filepath.Join(runtime, ".dsec"), Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	return s, nil
}

// sandboxEnv is the environment of a sandbox's agent, and so the base of
// every command's: the same for a cold start and a pool claim.
func sandboxEnv(sb backend.Spec) []string {
	env := map[string]string{"PATH": defaultPath, "HOME": "/root", "TERM": "xterm", "DSEC_SANDBOX_ID": sb.ID}
	maps.Copy(env, sb.Env)
	envList := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		envList = append(envList, k+"="+env[k])
	}
	return envList
}

// resources maps what the sandbox asked for onto cgroup limits.
func resources(r api.Resources) *specs.LinuxResources {
	deny := false
	out := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: deny, Access: "rwm"}},
	}
	if r.MemoryMB > 0 {
		limit := r.MemoryMB << 20
		out.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &limit}
	}
	if r.CPU > 0 {
		// The quota is written after start (runc.setCPUQuota).
		out.CPU = &specs.LinuxCPU{Shares: ptrTo(uint64(cpuShares(r.CPU)))}
	}
	if r.Pids > 0 {
		limit := r.Pids
		out.Pids = &specs.LinuxPids{Limit: &limit}
	}
	return out
}

// withNetwork gives a sandbox that has an interface its resolv.conf, and
// no IPv6 (its network is IPv4 only; this keeps link-local IPv6 off the
// bridge). Sysctls apply inside the sandbox's own network namespace.
func withNetwork(s *specs.Spec, resolvConf string) {
	s.Mounts = append(s.Mounts, specs.Mount{
		Destination: "/etc/resolv.conf", Type: "bind", Source: resolvConf,
		Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
	})
	s.Linux.Sysctl = map[string]string{
		"net.ipv6.conf.all.disable_ipv6":     "1",
		"net.ipv6.conf.default.disable_ipv6": "1",
	}
}
