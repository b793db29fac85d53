package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/seccomp"
)

// SeccompConfig sets up `dsec bench seccomp`.
type SeccompConfig struct {
	Runs    int
	WorkDir string
	Runc    string
	Out     io.Writer
}

// seccompCaps is the container backend's command capability set.
var seccompCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// Seccomp measures what `runc run` of `true` costs with Docker's seccomp
// profile in its spec (runc compiles it with libseccomp on every start:
// dsec before) and without (the agent loads a program compiled once per
// node: dsec now), alternating the two, as CPU time (runc and its
// children) and wall time; and what compiling the profile in pure Go
// costs, once per node.
func Seccomp(ctx context.Context, cfg SeccompConfig) error {
	w := cfg.Out
	prof, err := seccomp.Docker(seccompCaps)
	if err != nil {
		return err
	}
	t0 := time.Now()
	const compiles = 20
	for range compiles {
		if _, err := seccomp.Compile(prof); err != nil {
			return err
		}
	}
	compile := time.Since(t0) / compiles
	dir, err := os.MkdirTemp(cfg.WorkDir, "seccomp-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	if err := layer.MinimalBase(ctx, "/bin/busybox", rootfs); err != nil {
		return err
	}
	var cpu, wall [2][]time.Duration
	for i := range cfg.Runs {
		for k, p := range []*specs.LinuxSeccomp{prof, nil} {
			c, d, err := runcTrue(ctx, cfg.Runc, dir, rootfs, fmt.Sprintf("dsec-seccomp-bench-%d-%d-%d", os.Getpid(), i, k), p)
			if err != nil {
				return err
			}
			cpu[k], wall[k] = append(cpu[k], c), append(wall[k], d)
		}
	}
	fmt.Fprintf(w, "dsec bench seccomp: %d runs of `runc run true` each, alternating\n\n", cfg.Runs)
	fmt.Fprintf(w, "%-58s %10s %10s\n", "measure", "p50", "p99")
	for k, name := range []string{"runc run, Docker's profile in the spec (before)", "runc run, no seccomp section (now)"} {
		c, d := summarize(cpu[k]), summarize(wall[k])
		fmt.Fprintf(w, "%-58s %10s %10s\n", name+": CPU", ms(c.p50), ms(c.p99))
		fmt.Fprintf(w, "%-58s %10s %10s\n", name+": wall", ms(d.p50), ms(d.p99))
	}
	fmt.Fprintf(w, "%-58s %10s\n", "compile the profile in Go (once per node)", ms(compile))
	before, after := summarize(cpu[0]).p50, summarize(cpu[1]).p50
	fmt.Fprintf(w, "\nCPU per start saved: %s (%.0f%%)\n", ms(before-after), 100*float64(before-after)/float64(before))
	return nil
}

// runcTrue runs `true` in a container on rootfs and returns the CPU time
// runc and its children used, and the wall time.
func runcTrue(ctx context.Context, runc, dir, rootfs, id string, prof *specs.LinuxSeccomp) (time.Duration, time.Duration, error) {
	bundle := filepath.Join(dir, id)
	if err := os.Mkdir(bundle, 0o755); err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(bundle)
	s := &specs.Spec{
		Version: "1.0.2",
		Root:    &specs.Root{Path: rootfs, Readonly: true},
		Process: &specs.Process{
			Args: []string{"/bin/true"}, Cwd: "/", Env: []string{"PATH=/bin"},
			Capabilities:    &specs.LinuxCapabilities{Bounding: seccompCaps, Effective: seccompCaps, Permitted: seccompCaps},
			NoNewPrivileges: true,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/" + id,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			Seccomp: prof,
		},
	}
	b, err := json.Marshal(s)
	if err != nil {
		return 0, 0, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		return 0, 0, err
	}
	cmd := exec.CommandContext(ctx, runc, "--root", filepath.Join(dir, "runc"), "run", "--bundle", bundle, id)
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	wall := time.Since(t0)
	if err != nil {
		return 0, 0, fmt.Errorf("runc run: %v: %s", err, out)
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), wall, nil
}
