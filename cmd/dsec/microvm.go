package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/dsec-project/dsec/internal/backend/microvm"
	"github.com/dsec-project/dsec/internal/backend/microvm/qemu"
	"github.com/dsec-project/dsec/internal/initramfs"
)

// microvmFlags set up the microvm backend of a node.
type microvmFlags struct {
	mode   string
	kernel string
	qemu   string
	accel  string
}

func (m *microvmFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.mode, "microvm", "auto", "microvm backend: auto (on if QEMU and the guest kernel are here), on, off")
	fs.StringVar(&m.kernel, "microvm-kernel", "", "unpacked guest kernel package (default: guest-kernel next to dsec; `make guest-kernel`)")
	fs.StringVar(&m.qemu, "qemu", "qemu-system-x86_64", "QEMU binary for the microvm backend")
	fs.StringVar(&m.accel, "microvm-accel", "auto", "microvm accelerator: auto (KVM if it boots a guest here, else TCG), kvm, tcg")
}

func (m *microvmFlags) kernelDir() string {
	if m.kernel != "" {
		return m.kernel
	}
	if self, err := os.Executable(); err == nil {
		return filepath.Join(filepath.Dir(self), "guest-kernel")
	}
	return "guest-kernel"
}

// backend builds the microvm backend, or returns nil if it is off (or, in
// auto mode, if QEMU or the guest kernel is missing).
func (m *microvmFlags) backend(ctx context.Context, root, agent, cgroupParent string, maxFile int64, log *slog.Logger) (*microvm.Backend, error) {
	switch m.mode {
	case "off":
		return nil, nil
	case "on", "auto":
	default:
		return nil, fmt.Errorf("--microvm: want auto, on or off, not %q", m.mode)
	}
	k, kerr := initramfs.FindKernel(m.kernelDir())
	_, qerr := exec.LookPath(m.qemu)
	if err := errors.Join(kerr, qerr); err != nil {
		if m.mode == "on" {
			return nil, fmt.Errorf("microvm backend: %w", err)
		}
		log.InfoContext(ctx, "microvm backend off: QEMU or the guest kernel is missing (make guest-kernel)", "err", err)
		return nil, nil
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	vmm, err := qemu.New(ctx, qemu.Config{
		Binary: m.qemu, Accel: m.accel, Kernel: k.Image, CacheDir: root, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	_, vsockErr := os.Stat("/dev/vhost-vsock")
	b, err := microvm.New(microvm.Config{
		Root: root, VMM: vmm, Kernel: k, AgentPath: agent, MaxFileBytes: maxFile,
		CgroupParent: cgroupParent, Vsock: vsockErr == nil, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	log.InfoContext(ctx, "microvm backend on", "vmm", vmm.Name(), "accel", vmm.Accel(), "kernel", k.Version, "vsock", vsockErr == nil)
	return b, nil
}
