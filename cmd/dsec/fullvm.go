package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"

	"github.com/dsec-project/dsec/internal/backend/microvm"
	"github.com/dsec-project/dsec/internal/backend/microvm/qemu"
	"github.com/dsec-project/dsec/internal/initramfs"
)

// fullvmFlags set up the fullvm backend of a node: the microVM backend's
// code in its full-VM mode (q35 PCs booting vm layers).
type fullvmFlags struct {
	mode string
}

func (f *fullvmFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.mode, "fullvm", "auto", "fullvm backend: auto (on if QEMU and qemu-img are here), on, off")
}

// backend builds the fullvm backend, or returns nil if it is off (or, in
// auto mode, if QEMU or qemu-img is missing). It shares the microvm
// flags' QEMU binary and accelerator.
func (f *fullvmFlags) backend(ctx context.Context, m *microvmFlags, root, cgroupParent string, maxFile int64, log *slog.Logger) (*microvm.Backend, error) {
	switch f.mode {
	case "off":
		return nil, nil
	case "on", "auto":
	default:
		return nil, fmt.Errorf("--fullvm: want auto, on or off, not %q", f.mode)
	}
	var errs []error
	for _, tool := range []string{m.qemu, "qemu-img", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		if f.mode == "on" {
			return nil, fmt.Errorf("fullvm backend: %w", err)
		}
		log.InfoContext(ctx, "fullvm backend off: QEMU, qemu-img or debugfs is missing", "err", err)
		return nil, nil
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	// The KVM probe boots the microVM guest kernel if there is one;
	// without it, full VMs run under TCG.
	probe := ""
	if k, err := initramfs.FindKernel(m.kernelDir()); err == nil {
		probe = k.Image
	}
	vmm, err := qemu.New(ctx, qemu.Config{Binary: m.qemu, Accel: m.accel, Kernel: probe, CacheDir: os.TempDir(), Logger: log})
	if err != nil {
		return nil, err
	}
	b, err := microvm.New(microvm.Config{
		Root: root, VMM: vmm, FullVM: true, MaxFileBytes: maxFile, CgroupParent: cgroupParent, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	log.InfoContext(ctx, "fullvm backend on", "vmm", vmm.Name(), "accel", vmm.Accel())
	return b, nil
}
