package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// GuestKernelDir is where `make guest-kernel` unpacks the microVM guest
// kernel package (bin/guest-kernel), or $DSEC_GUEST_KERNEL.
func GuestKernelDir() string {
	if d := os.Getenv("DSEC_GUEST_KERNEL"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "bin", "guest-kernel")
}

// GuestKernel requires the microVM guest kernel (make guest-kernel).
func GuestKernel() string {
	images, _ := filepath.Glob(filepath.Join(GuestKernelDir(), "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return fmt.Sprintf("needs the microVM guest kernel in %s (make guest-kernel)", GuestKernelDir())
	}
	return ""
}

// MicroVMRequirements are what a microVM sandbox needs from the machine.
var MicroVMRequirements = []Requirement{Root, Tool("qemu-system-x86_64"), Tool("mkfs.ext4"), GuestKernel}

// killVMs kills the VMM processes a crashed server left under dir.
func killVMs(dir string) {
	for _, p := range vmProcesses(dir) {
		if pid, err := strconv.Atoi(strings.Fields(p)[1]); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
