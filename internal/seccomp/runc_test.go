package seccomp_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// runcFilter starts a container with runc under prof and caps, and returns
// the filter runc loaded into it, read back with PTRACE_SECCOMP_GET_FILTER:
// libseccomp's program with runc's own patches, exactly as the kernel
// runs it.
func runcFilter(t *testing.T, prof *specs.LinuxSeccomp, caps []string) []bpf.RawInstruction {
	t.Helper()
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "proc", "dev"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, "/bin/busybox", filepath.Join(rootfs, "bin/busybox"))
	var suffix [6]byte
	rand.Read(suffix[:])
	id := "dsec-seccomp-" + hex.EncodeToString(suffix[:])
	spec := &specs.Spec{
		Version: "1.0.2",
		Root:    &specs.Root{Path: rootfs},
		Process: &specs.Process{
			Args: []string{"/bin/busybox", "sleep", "600"}, Cwd: "/", Env: []string{"PATH=/bin"},
			Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			NoNewPrivileges: true,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/" + id + "/c",
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
			},
			Seccomp: prof,
		},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Cleanup(func() {
		exec.Command("runc", "--root", state, "delete", "--force", id).Run()
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + id)
		for _, d := range append(dirs, "/sys/fs/cgroup/"+id) {
			os.Remove(filepath.Join(d, "c"))
			os.Remove(d)
		}
	})
	// The container's stdio must not be a pipe we wait on.
	logf, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	run := exec.CommandContext(ctx, "runc", "--root", state, "run", "--detach", "--bundle", dir, id)
	run.Stdout, run.Stderr = logf, logf
	if err := run.Run(); err != nil {
		out, _ := os.ReadFile(logf.Name())
		t.Fatalf("runc run: %v: %s", err, out)
	}
	out, err := exec.CommandContext(ctx, "runc", "--root", state, "state", id).Output()
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid == 0 {
		t.Fatalf("runc state: %s %v", out, err)
	}
	prog, err := filterOf(st.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return prog
}

const (
	ptraceSeize           = 0x4206
	ptraceInterrupt       = 0x4207
	ptraceSeccompGetFilte = 0x420c
)

// filterOf reads the newest seccomp filter of process pid.
func filterOf(pid int) ([]bpf.RawInstruction, error) {
	runtime.LockOSThread() // ptrace requests must come from the tracer thread
	defer runtime.UnlockOSThread()
	if _, _, e := unix.Syscall6(unix.SYS_PTRACE, ptraceSeize, uintptr(pid), 0, 0, 0, 0); e != 0 {
		return nil, os.NewSyscallError("ptrace seize", e)
	}
	defer unix.PtraceDetach(pid)
	if _, _, e := unix.Syscall6(unix.SYS_PTRACE, ptraceInterrupt, uintptr(pid), 0, 0, 0, 0); e != 0 {
		return nil, os.NewSyscallError("ptrace interrupt", e)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
		return nil, err
	}
	n, _, e := unix.Syscall6(unix.SYS_PTRACE, ptraceSeccompGetFilte, uintptr(pid), 0, 0, 0, 0)
	if e != 0 {
		return nil, os.NewSyscallError("ptrace seccomp get filter", e)
	}
	buf := make([]unix.SockFilter, n)
	if _, _, e := unix.Syscall6(unix.SYS_PTRACE, ptraceSeccompGetFilte, uintptr(pid), 0, uintptr(unsafe.Pointer(&buf[0])), 0, 0); e != 0 {
		return nil, os.NewSyscallError("ptrace seccomp get filter", e)
	}
	out := make([]bpf.RawInstruction, n)
	for i, f := range buf {
		out[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	return out, nil
}

func copyFile(t *testing.T, src, dst string) {
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
