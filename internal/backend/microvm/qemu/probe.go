package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

// probeKVM reports whether KVM runs a normal guest here: /dev/kvm can be
// opened and the guest kernel, booted under KVM with no root, gets as far
// as panicking (which ends QEMU, as it runs with -no-reboot). Some hosts
// (nested hypervisors that run only paravirtual guests) offer /dev/kvm on
// which QEMU aborts or the boot hangs. The answer is kept in cacheDir for
// this host kernel, QEMU version and guest kernel (probeKey), so that a
// restart does not wait for a probe boot again.
func probeKVM(ctx context.Context, bin, kernel, cacheDir string) (bool, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Sprintf("open /dev/kvm: %v", err)
	}
	f.Close()
	if kernel == "" {
		return false, "no guest kernel to probe with"
	}
	key := probeKey(ctx, bin, kernel)
	cache := filepath.Join(cacheDir, "kvm-probe")
	if b, err := os.ReadFile(cache); err == nil {
		if k, res, ok := strings.Cut(string(b), "\n"); ok && k == key {
			ok, why, _ := strings.Cut(res, " ")
			return ok == "yes", why
		}
	}
	ok, why := probeBoot(ctx, bin, kernel)
	res := "no " + why
	if ok {
		res = "yes " + why
	}
	if cacheDir != "" {
		os.WriteFile(cache, []byte(key+"\n"+res), 0o600)
	}
	return ok, why
}

// probeKey names what the probe's answer depends on: the host kernel's
// release and build, QEMU's version and the guest kernel (path, size and
// time).
func probeKey(ctx context.Context, bin, kernel string) string {
	var u syscall.Utsname
	syscall.Uname(&u)
	out, _ := exec.CommandContext(ctx, bin, "--version").Output()
	version, _, _ := strings.Cut(string(out), "\n")
	guest := kernel
	if st, err := os.Stat(kernel); err == nil {
		guest = fmt.Sprintf("%s %d %d", kernel, st.Size(), st.ModTime().UnixNano())
	}
	return strings.Join([]string{utsString(u.Release[:]), utsString(u.Version[:]), bin, strings.TrimSpace(version), guest}, " | ")
}

func utsString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func probeBoot(ctx context.Context, bin, kernel string) (bool, string) {
	dir, err := os.MkdirTemp("", "dsec-kvm-probe-")
	if err != nil {
		return false, err.Error()
	}
	defer os.RemoveAll(dir)
	log := filepath.Join(dir, "console.log")
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	args := append(machineArgs("kvm"), "-m", "128", "-kernel", kernel,
		"-append", "console=ttyS0 panic=-1 reboot=t rdinit=/dsec-no-init root=/dev/dsec-no-root",
		"-serial", "file:"+log)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	var out []byte
	ran := make(chan struct{})
	go func() {
		// The parent-death signal follows the thread that started QEMU:
		// keep that thread until QEMU is reaped, or a goroutine that
		// locks it and exits (idmap's mount helper) kills the probe.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		out, err = cmd.CombinedOutput()
		close(ran)
	}()
	<-ran
	console, _ := os.ReadFile(log)
	switch {
	case ctx.Err() != nil:
		return false, fmt.Sprintf("a KVM guest did not boot within %s", probeTimeout)
	case err != nil:
		return false, fmt.Sprintf("qemu under KVM: %v: %s", err, firstLine(out))
	case !strings.Contains(string(console), "Kernel panic"):
		return false, "the KVM guest stopped before its kernel ran"
	}
	return true, "a KVM guest booted"
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}
