package microvm

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/guestinit"
	"github.com/dsec-project/dsec/internal/vmimage"
)

// Full VMs (Config.FullVM): the sandbox's single layer is a vm layer, a
// whole disk image. Its kernel and initrd are copied out once per node
// (images/<layer digest>/) and booted directly by a q35 PC; the guest's
// own systemd starts dsec-agent, which serves on the virtio-serial port
// as a microVM's agent does. The guest writes to a qcow2 overlay in the
// sandbox's directory whose backing file is the layer image: the layer
// is never copied nor written. A reset boots again on a fresh overlay.

const (
	// overlayFile is a full VM's disk: the layer's changes.
	overlayFile = "disk.qcow2"
	// RootSerial is the virtio serial of a full VM's disk.
	RootSerial = "dsec-root"
	// MinFullMemoryMB is the least RAM a full VM boots systemd with.
	MinFullMemoryMB = 256
	// defaultFullMemoryMB is a full VM's RAM when the spec leaves it open.
	defaultFullMemoryMB = 1024
)

func validateFull(spec backend.Spec) error {
	switch {
	case spec.ID == "" || filepath.Base(spec.ID) != spec.ID || strings.ContainsAny(spec.ID, ", "):
		return errdefs.Invalid("sandbox id %q is not a plain name", spec.ID)
	case len(spec.Layers) != 1:
		return errdefs.Invalid("a fullvm sandbox boots one vm layer (a disk image), not %d layers", len(spec.Layers))
	case spec.Layers[0].Dir || spec.Layers[0].Device != "":
		return errdefs.Invalid("layer %s is not a disk image: a fullvm sandbox boots a vm layer", spec.Layers[0].Digest)
	case spec.Resources.MemoryMB != 0 && spec.Resources.MemoryMB < MinFullMemoryMB:
		return errdefs.Invalid("a fullvm sandbox needs memory_mb >= %d, not %d", MinFullMemoryMB, spec.Resources.MemoryMB)
	case spec.Network.Mode != "" && spec.Network.Mode != api.NetworkNone:
		return errdefs.Invalid("the fullvm backend offers network %q only, not %q", api.NetworkNone, spec.Network.Mode)
	case spec.NeedsNetwork:
		return errdefs.Invalid("a fullvm sandbox has no network interface: no phase of it may use the network")
	}
	return nil
}

// fullMachine is the q35 PC a spec asks for; it copies the image's kernel
// and initrd out on the first boot of the layer on this node.
func (b *Backend) fullMachine(ctx context.Context, spec backend.Spec) (Machine, error) {
	l := spec.Layers[0]
	if _, err := os.Stat(l.Path); err != nil {
		return Machine{}, fmt.Errorf("layer %s: %w", l.Digest, errdefs.ErrNotFound)
	}
	bt, err := b.inspect(ctx, l)
	if err != nil {
		return Machine{}, fmt.Errorf("layer %s: %w", l.Digest, err)
	}
	dir := b.dir(spec.ID)
	mem := spec.Resources.MemoryMB
	if mem == 0 {
		mem = defaultFullMemoryMB
	}
	return Machine{
		ID: spec.ID, Type: TypeQ35, Dir: dir, Kernel: bt.Kernel, Initrd: bt.Initrd,
		// console=tty0 last: the screen is the console (its login shell is
		// what a user at the screen types into); the serial port logs.
		Cmdline:   "root=" + bt.Root + " rw console=ttyS0 console=tty0 quiet loglevel=3 panic=-1 systemd.show_status=false",
		VCPUs:     max(1, int(math.Ceil(spec.Resources.CPU))),
		MemoryMB:  mem,
		Transport: guestinit.TransportSerial,
		Drives: []Drive{
			{Path: filepath.Join(dir, overlayFile), Serial: RootSerial, Format: vmimage.FormatQcow2},
			{Path: filepath.Join(dir, "config.img"), Serial: guestinit.ConfigSerial, ReadOnly: true},
		},
	}, nil
}

// inspect finds how to boot a vm layer, once per layer and node.
func (b *Backend) inspect(ctx context.Context, l backend.Layer) (vmimage.Boot, error) {
	h, err := contentdigest.Parse(l.Digest)
	if err != nil {
		h = strconv.FormatUint(uint64(cidFor(l.Path)), 16)
	}
	b.inspectMu.Lock()
	defer b.inspectMu.Unlock()
	return vmimage.Inspect(ctx, l.Path, filepath.Join(b.cfg.Root, "images", h))
}

// makeOverlay makes a full VM's fresh disk: a qcow2 overlay over the layer
// image, as large as the spec's disk_mb if that is more than the image
// (the guest grows its root file system to the disk at boot).
func (b *Backend) makeOverlay(ctx context.Context, v *vm) error {
	l := v.Spec.Layers[0]
	bt, err := b.inspect(ctx, l)
	if err != nil {
		return err
	}
	path := filepath.Join(v.Machine.Dir, overlayFile)
	os.Remove(path)
	args := []string{"create", "-q", "-f", "qcow2", "-F", bt.Format, "-b", l.Path, path}
	if disk := v.Spec.Resources.DiskMB; disk > bt.VirtualMB {
		args = append(args, strconv.FormatInt(disk, 10)+"M")
	}
	if out, err := exec.CommandContext(ctx, "qemu-img", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("disk overlay: qemu-img: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// SnapshotDisk implements backend.DiskSnapshotter: the guest's agent
// freezes its root file system (every change flushed to the disk), the
// VM is paused (QEMU flushes the overlay), the overlay file is copied,
// and the guest runs on; then the copy and the layer under it are
// written as one standalone qcow2 image, which pack stores as a new vm
// layer. A paused sandbox stays paused.
func (b *Backend) SnapshotDisk(ctx context.Context, id string, pack func(ctx context.Context, path string) error) error {
	v, err := b.get(id)
	if err != nil {
		return err
	}
	if v.Machine.Type != TypeQ35 {
		return errdefs.Invalid("sandbox %s is not a full VM", id)
	}
	work, err := os.MkdirTemp(v.Machine.Dir, "snapshot-")
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", id, err)
	}
	defer os.RemoveAll(work)
	top := filepath.Join(work, "top.qcow2")
	if err := b.copyOverlay(ctx, v, top); err != nil {
		return fmt.Errorf("snapshot %s: %w", id, err)
	}
	flat := filepath.Join(work, "disk.qcow2")
	cmd := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "qcow2", "-O", "qcow2", top, flat)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("snapshot %s: qemu-img convert: %w: %s", id, err, strings.TrimSpace(string(out)))
	}
	os.Remove(top)
	return pack(ctx, flat)
}

// copyOverlay copies the overlay of a frozen, paused guest to dst.
func (b *Backend) copyOverlay(ctx context.Context, v *vm, dst string) (err error) {
	paused := v.link.paused.Load()
	if paused {
		if err := b.Resume(ctx, v.Spec.ID); err != nil {
			return err
		}
		defer b.Pause(context.WithoutCancel(ctx), v.Spec.ID)
	}
	ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return v.link.dial(ctx) })
	defer ag.Close()
	if err := ag.Freeze(ctx, snapshotFreeze); err != nil {
		return err
	}
	defer func() {
		if terr := ag.Thaw(context.WithoutCancel(ctx)); terr != nil && err == nil {
			err = terr
		}
	}()
	// Pausing drains and flushes QEMU's block layer: the overlay file is
	// complete while the vCPUs are stopped.
	v.link.paused.Store(true)
	if err := b.cfg.VMM.Pause(ctx, &v.Machine, v.proc()); err != nil {
		v.link.paused.Store(false)
		return err
	}
	defer func() {
		if rerr := b.cfg.VMM.Resume(context.WithoutCancel(ctx), &v.Machine, v.proc()); rerr != nil && err == nil {
			err = rerr
		}
		v.link.paused.Store(false)
	}()
	out, err := exec.CommandContext(ctx, "cp", "--sparse=always", filepath.Join(v.Machine.Dir, overlayFile), dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy the disk overlay: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
