// Package microvm is the microVM backend: each sandbox is a virtual
// machine with its own guest kernel, run by a VMM driver (package qemu:
// QEMU's microvm machine, under KVM where it works and TCG elsewhere). The
// guest boots an initramfs built by dsec, whose init is dsec-agent: it
// stacks the sandbox's EROFS layers (read-only virtio disks) under an
// overlay whose upper dir lives on a per-VM writable disk, switches root
// and serves the agent API over vsock, or over a virtio-serial port
// multiplexed with package vmlink where the host has no vsock.
//
// A VM is a process of its own, not the edge's child: killing the edge
// never stops a sandbox, and Recover adopts the VMs again. This package
// must never leave a VM process, socket or disk behind when a create
// fails or a sandbox is destroyed, and never hand a guest a writable
// view of a layer image.
package microvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/guestinit"
	"github.com/dsec-project/dsec/internal/initramfs"
	"github.com/dsec-project/dsec/internal/vmlink"
)

// Limits of a microVM sandbox.
const (
	// MinMemoryMB is the least RAM a guest boots with: the kernel, the
	// initramfs (unpacked in RAM) and the agent.
	MinMemoryMB = 128
	// MaxLayers bounds the layer disks: microvm has 24 virtio-mmio slots,
	// three of which hold the config drive, the writable disk and the
	// agent's port. A chunked layer takes two (metadata and data blob).
	MaxLayers      = 16
	maxLayerDrives = 20
	// defaultDiskMB sizes the writable disk when the spec leaves it open.
	defaultDiskMB = 10 << 10
	// defaultMemoryMB is the RAM when the spec leaves it open.
	defaultMemoryMB = 256
)

// Config configures the backend.
type Config struct {
	// Root is the backend's state directory on node-local disk.
	Root string
	VMM  VMM
	// Kernel is the guest kernel (see initramfs.FindKernel).
	Kernel initramfs.Kernel
	// AgentPath is the static dsec-agent binary, the guest's init.
	AgentPath string
	// Vsock makes guests reachable over vsock (the host needs
	// /dev/vhost-vsock); otherwise over a virtio-serial port.
	Vsock bool
	// MaxFileBytes bounds files read or written through the agent.
	MaxFileBytes int64
	// CgroupParent is the cgroup under which each VM's process gets a
	// cgroup capping its CPU time at the sandbox's CPU share; "" leaves
	// VMs uncapped.
	CgroupParent string
	// BootTimeout bounds a boot, from starting the VMM to the agent's
	// answer; 2 minutes by default (TCG on a loaded host is slow), 10
	// for full VMs.
	BootTimeout time.Duration
	// Link tunes the serial link: how soon an unresponsive guest is
	// declared hung.
	Link vmlink.ClientConfig
	// FullVM makes this the fullvm backend: each sandbox is a q35 PC
	// booting a vm layer's disk image (its own kernel, initrd and
	// systemd, the agent a unit of it) over a qcow2 overlay; Kernel and
	// AgentPath are not used.
	FullVM bool
	Logger *slog.Logger
}

// Backend is the microVM backend.
type Backend struct {
	cfg    Config
	initrd string
	log    *slog.Logger
	cg     *cpuCgroups // nil: no CPU caps

	// inspectMu serializes copying kernels out of vm layers.
	inspectMu sync.Mutex

	mu  sync.Mutex
	vms map[string]*vm
}

// vm is what the backend keeps of a sandbox, in memory and in
// <dir>/vm.json. The file is written once the guest's agent has answered:
// a directory without it is a create that did not finish.
type vm struct {
	Spec    backend.Spec `json:"spec"`
	Machine Machine      `json:"machine"`
	link    *link

	// mu guards Process and Hibernated, which a reset or a resume
	// replaces while State or Dial may read them.
	mu      sync.Mutex
	Process Process `json:"process"`
	// Hibernated says the guest's memory is in memoryFile and no VMM
	// runs (see Hibernate).
	Hibernated bool `json:"hibernated,omitempty"`
}

func (v *vm) hibernated() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.Hibernated
}

func (v *vm) proc() Process {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.Process
}

// record is what vm.json holds.
func (v *vm) record() vmRecord {
	v.mu.Lock()
	defer v.mu.Unlock()
	return vmRecord{Spec: v.Spec, Machine: v.Machine, Process: v.Process, Hibernated: v.Hibernated}
}

type vmRecord struct {
	Spec       backend.Spec `json:"spec"`
	Machine    Machine      `json:"machine"`
	Process    Process      `json:"process"`
	Hibernated bool         `json:"hibernated,omitempty"`
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Phaser  = (*Backend)(nil)
)

// New prepares the backend's directories and the guests' initramfs.
func New(cfg Config) (*Backend, error) {
	if cfg.VMM == nil || (!cfg.FullVM && (cfg.AgentPath == "" || cfg.Kernel.Image == "")) {
		return nil, errors.New("microvm backend: needs a VMM, a guest kernel and the agent binary")
	}
	if cfg.BootTimeout <= 0 {
		cfg.BootTimeout = 2 * time.Minute
		if cfg.FullVM {
			// A whole distribution boots, under TCG in tens of seconds
			// on an idle host, minutes on a loaded one.
			cfg.BootTimeout = 10 * time.Minute
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	for _, d := range []string{"vms", "images"} {
		if err := os.MkdirAll(filepath.Join(cfg.Root, d), 0o700); err != nil {
			return nil, fmt.Errorf("microvm backend: %w", err)
		}
	}
	var initrd string
	if !cfg.FullVM {
		var err error
		initrd, err = buildInitramfs(filepath.Join(cfg.Root, "images"), cfg.AgentPath, cfg.Kernel, cfg.Vsock)
		if err != nil {
			return nil, fmt.Errorf("microvm backend: initramfs: %w", err)
		}
	}
	b := &Backend{
		cfg:    cfg,
		initrd: initrd,
		vms:    map[string]*vm{},
	}
	b.log = cfg.Logger.With("backend", b.Name())
	var err error
	if cfg.CgroupParent != "" {
		if b.cg, err = findCPUCgroups(); err != nil {
			b.log.Warn("the CPU time of microVMs is not capped", "err", err)
		}
	}
	return b, nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string {
	if b.cfg.FullVM {
		return api.BackendFullVM
	}
	return api.BackendMicroVM
}

// Accel is the accelerator the VMs run with ("kvm" or "tcg").
func (b *Backend) Accel() string { return b.cfg.VMM.Accel() }

func (b *Backend) dir(id string) string { return filepath.Join(b.cfg.Root, "vms", id) }

// layerDrives counts the drives the layers take.
func layerDrives(spec backend.Spec) int {
	return len(spec.Layers) + len(blobIndexes(spec))
}

// blobIndexes lists the layers that have a data blob.
func blobIndexes(spec backend.Spec) []int {
	var out []int
	for i, l := range spec.Layers {
		if l.Device != "" {
			out = append(out, i)
		}
	}
	return out
}

// layersPresent checks every file of every layer is on the node.
func layersPresent(spec backend.Spec) error {
	for _, l := range spec.Layers {
		for _, p := range []string{l.Path, l.Device} {
			if p == "" {
				continue
			}
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("layer %s: %w", l.Digest, errdefs.ErrNotFound)
			}
		}
	}
	return nil
}

func validate(spec backend.Spec) error {
	for _, l := range spec.Layers {
		if l.Dir {
			return errdefs.Invalid("layer %s is a directory; a microvm sandbox takes EROFS images only", l.Digest)
		}
	}
	switch {
	case spec.ID == "" || filepath.Base(spec.ID) != spec.ID || strings.ContainsAny(spec.ID, ", "):
		return errdefs.Invalid("sandbox id %q is not a plain name", spec.ID)
	case len(spec.Layers) == 0:
		return errdefs.Invalid("sandbox spec needs at least one layer")
	case len(spec.Layers) > MaxLayers:
		return errdefs.Invalid("a microvm sandbox takes at most %d layers, not %d", MaxLayers, len(spec.Layers))
	case layerDrives(spec) > maxLayerDrives:
		return errdefs.Invalid("a microvm sandbox takes at most %d layer drives (a chunked layer takes two), not %d",
			maxLayerDrives, layerDrives(spec))
	case spec.Resources.MemoryMB != 0 && spec.Resources.MemoryMB < MinMemoryMB:
		return errdefs.Invalid("a microvm sandbox needs memory_mb >= %d, not %d", MinMemoryMB, spec.Resources.MemoryMB)
	case spec.Network.Mode != "" && spec.Network.Mode != api.NetworkNone:
		return errdefs.Invalid("the microvm backend offers network %q only, not %q", api.NetworkNone, spec.Network.Mode)
	case spec.NeedsNetwork:
		return errdefs.Invalid("a microvm sandbox has no network interface: no phase of it may use the network")
	}
	return nil
}

// machine is the VM a spec asks for.
func (b *Backend) machine(spec backend.Spec) Machine {
	dir := b.dir(spec.ID)
	mem := spec.Resources.MemoryMB
	if mem == 0 {
		mem = defaultMemoryMB
	}
	m := Machine{
		ID: spec.ID, Dir: dir, Kernel: b.cfg.Kernel.Image, Initrd: b.initrd,
		// panic=-1 reboot=t: a guest that panics (or whose init dies)
		// reboots at once by triple fault, and -no-reboot ends the VMM.
		Cmdline:   "console=ttyS0 quiet loglevel=3 panic=-1 reboot=t 8250.nr_uarts=1",
		VCPUs:     max(1, int(math.Ceil(spec.Resources.CPU))),
		MemoryMB:  mem,
		Transport: guestinit.TransportSerial,
		Drives: []Drive{
			{Path: filepath.Join(dir, "config.img"), Serial: guestinit.ConfigSerial, ReadOnly: true},
			{Path: filepath.Join(dir, "rw.img"), Serial: guestinit.WritableSerial},
		},
	}
	for i, l := range spec.Layers {
		m.Drives = append(m.Drives, Drive{Path: l.Path, Serial: guestinit.LayerSerial(i), ReadOnly: true})
		if l.Device != "" {
			// The data blob: a file on node disk, or a blobfs file that
			// fetches chunks as the guest reads them.
			m.Drives = append(m.Drives, Drive{Path: l.Device, Serial: guestinit.BlobSerial(i), ReadOnly: true})
		}
	}
	if b.cfg.Vsock {
		m.Transport = guestinit.TransportVsock
		m.CID = cidFor(spec.ID)
	}
	return m
}

// Create implements backend.Backend.
func (b *Backend) Create(ctx context.Context, spec backend.Spec) (err error) {
	check := validate
	if b.cfg.FullVM {
		check = validateFull
	}
	if err := check(spec); err != nil {
		return err
	}
	if err := layersPresent(spec); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	dir := b.dir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	v := &vm{Spec: spec}
	if b.cfg.FullVM {
		v.Machine, err = b.fullMachine(ctx, spec)
		if err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	} else {
		v.Machine = b.machine(spec)
	}
	v.link = newLink(&v.Machine, b.cfg.Link)
	defer func() {
		if err != nil {
			b.teardown(context.WithoutCancel(ctx), spec.ID, v)
		}
	}()
	t0 := time.Now()
	if err := b.boot(ctx, v, true); err != nil {
		return err
	}
	b.log.DebugContext(ctx, "created", "sandbox", spec.ID, "boot", time.Since(t0), "accel", b.Accel())
	b.mu.Lock()
	b.vms[spec.ID] = v
	b.mu.Unlock()
	return nil
}

// boot starts the VM of v, on a fresh writable disk or the one it has,
// and waits until its agent answers; then it records the VM in vm.json.
// On error the VMM process is gone (the directory is the caller's).
func (b *Backend) boot(ctx context.Context, v *vm, freshDisk bool) (err error) {
	id, dir := v.Spec.ID, v.Machine.Dir
	if err := b.writeConfigDrive(v); err != nil {
		return fmt.Errorf("boot sandbox %s: %w", id, err)
	}
	if freshDisk && v.Machine.Type == TypeQ35 {
		if err := b.makeOverlay(ctx, v); err != nil {
			return fmt.Errorf("boot sandbox %s: %w", id, err)
		}
	} else if freshDisk {
		disk := v.Spec.Resources.DiskMB
		if disk <= 0 {
			disk = defaultDiskMB
		}
		if err := makeWritableDisk(ctx, filepath.Join(dir, "rw.img"), disk); err != nil {
			return fmt.Errorf("boot sandbox %s: %w", id, err)
		}
	}
	os.Remove(filepath.Join(dir, ConsoleLog))
	p, err := b.cfg.VMM.Start(ctx, &v.Machine)
	if err != nil {
		return fmt.Errorf("boot sandbox %s: %w", id, err)
	}
	v.mu.Lock()
	v.Process = p
	v.mu.Unlock()
	defer func() {
		if err != nil {
			v.link.close()
			b.cfg.VMM.Stop(context.WithoutCancel(ctx), &v.Machine, p)
		}
	}()
	if err := b.waitAgent(ctx, v); err != nil {
		return err
	}
	// The cap applies once the guest has booted, as the container
	// backend's quota applies once the container has started: a boot at
	// a fraction of a core would only be slower.
	if b.cg != nil && v.Spec.Resources.CPU > 0 {
		if err := b.cg.place(b.cfg.CgroupParent, id, p.Pid, v.Spec.Resources.CPU); err != nil {
			return fmt.Errorf("boot sandbox %s: %w", id, err)
		}
	}
	if err := b.pushFiles(ctx, v); err != nil {
		return err
	}
	if err := b.cfg.VMM.Booted(ctx, &v.Machine, p); err != nil {
		b.log.WarnContext(ctx, "after boot", "sandbox", id, "err", err)
	}
	if err := backend.WriteJSONFile(filepath.Join(dir, "vm.json"), v.record()); err != nil {
		return fmt.Errorf("boot sandbox %s: %w", id, err)
	}
	return nil
}

// writeConfigDrive writes the guest's configuration drive.
func (b *Backend) writeConfigDrive(v *vm) error {
	cfg := guestinit.Config{
		ID: v.Spec.ID, Layers: len(v.Spec.Layers), Blobs: blobIndexes(v.Spec), Env: v.Spec.Env,
		Transport: v.Machine.Transport, VsockPort: agentVsockPort, MaxFileBytes: b.cfg.MaxFileBytes,
	}
	return guestinit.WriteConfigDrive(filepath.Join(v.Machine.Dir, "config.img"), cfg)
}

// waitAgent waits until the guest's agent answers on the link, failing
// early if the VM stops (a guest that panics ends its VMM) and after
// BootTimeout if it hangs.
func (b *Backend) waitAgent(ctx context.Context, v *vm) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.BootTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		for {
			actx, acancel := context.WithTimeout(ctx, 5*time.Second)
			err := v.link.alive(actx)
			acancel()
			if err == nil || ctx.Err() != nil {
				done <- err
				return
			}
			// vsock refuses until the agent listens: try again shortly.
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err == nil {
				return nil
			}
			return fmt.Errorf("sandbox %s: the guest did not boot within %s: %w%s", v.Spec.ID, b.cfg.BootTimeout,
				errdefs.ErrUnavailable, consoleTail(v.Machine.Dir))
		case <-tick.C:
			if !v.proc().Alive() {
				cancel()
				<-done
				return fmt.Errorf("sandbox %s: the guest stopped while booting: %w%s", v.Spec.ID,
					errdefs.ErrUnavailable, consoleTail(v.Machine.Dir))
			}
		}
	}
}

// consoleTail is the end of the guest's boot log, for error messages.
func consoleTail(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, ConsoleLog))
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b[max(0, len(b)-2048):])), "\n")
	return "; console: " + strings.Join(lines[max(0, len(lines)-6):], " | ")
}

// teardown removes everything of a sandbox, tolerating what is already
// gone. It is the single cleanup path for failed creates and destroys.
func (b *Backend) teardown(ctx context.Context, id string, v *vm) error {
	dir := b.dir(id)
	var errs []error
	if v != nil {
		v.link.close()
		if err := b.cfg.VMM.Stop(ctx, &v.Machine, v.proc()); err != nil {
			errs = append(errs, err)
		}
	}
	// A VMM started by a create that never recorded it (the edge died
	// during boot) is found through its pid file.
	if p, ok := vmmFromPidFile(dir); ok {
		if err := p.Kill(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := b.removeCgroup(id); err != nil {
		errs = append(errs, err)
	}
	return backend.FinishTeardown(id, dir, errs)
}

// Destroy implements backend.Backend.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	return backend.Destroy(&b.mu, b.vms, id, func(v *vm) error { return b.teardown(ctx, id, v) })
}

func (b *Backend) removeCgroup(id string) error {
	if b.cg == nil {
		return nil
	}
	return b.cg.remove(b.cfg.CgroupParent, id)
}

func (b *Backend) get(id string) (*vm, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.vms[id]
	if !ok {
		return nil, errdefs.NotFound("sandbox %s", id)
	}
	return v, nil
}

// Reset implements backend.Backend: the VM is stopped and booted again on
// a fresh writable disk over the same layers. Nothing of the old guest
// survives, not even its kernel's state.
func (b *Backend) Reset(ctx context.Context, id string) error {
	v, err := b.get(id)
	if err != nil {
		return err
	}
	v.link.close()
	v.link.paused.Store(false)
	if err := b.cfg.VMM.Stop(ctx, &v.Machine, v.proc()); err != nil {
		return fmt.Errorf("reset sandbox %s: %w", id, err)
	}
	if v.hibernated() {
		v.mu.Lock()
		v.Hibernated = false
		v.mu.Unlock()
		os.Remove(filepath.Join(v.Machine.Dir, memoryFile))
	}
	if err := b.removeCgroup(id); err != nil {
		return fmt.Errorf("reset sandbox %s: %w", id, err)
	}
	if err := b.boot(ctx, v, true); err != nil {
		return fmt.Errorf("reset sandbox %s: %w", id, err)
	}
	return nil
}

// Pause implements backend.Backend: the vCPUs stop. The link stops
// pinging the guest meanwhile, so requests in flight wait for Resume, as
// they do in a frozen container.
func (b *Backend) Pause(ctx context.Context, id string) error {
	v, err := b.get(id)
	if err != nil {
		return err
	}
	if v.hibernated() {
		return nil
	}
	v.link.paused.Store(true)
	if err := b.cfg.VMM.Pause(ctx, &v.Machine, v.proc()); err != nil {
		v.link.paused.Store(false)
		return err
	}
	return nil
}

// Resume implements backend.Backend.
func (b *Backend) Resume(ctx context.Context, id string) error {
	v, err := b.get(id)
	if err != nil {
		return err
	}
	if v.hibernated() {
		return b.wake(ctx, v)
	}
	if err := b.cfg.VMM.Resume(ctx, &v.Machine, v.proc()); err != nil {
		return err
	}
	v.link.paused.Store(false)
	return nil
}

// Dial implements backend.Backend.
func (b *Backend) Dial(ctx context.Context, id string) (net.Conn, error) {
	v, err := b.get(id)
	if err != nil {
		return nil, err
	}
	return v.link.dial(ctx)
}

// State implements backend.Backend. A VM whose process is gone, whose
// guest shut down or panicked, or whose running guest does not answer
// on its link (hung) is failed.
func (b *Backend) State(ctx context.Context, id string) (string, error) {
	v, err := b.get(id)
	if err != nil {
		return "", err
	}
	if v.hibernated() {
		return api.StatePaused, nil
	}
	st, err := b.cfg.VMM.Status(ctx, &v.Machine, v.proc())
	if err != nil {
		return "", fmt.Errorf("state of sandbox %s: %w", id, err)
	}
	switch st {
	case StatusPaused:
		return api.StatePaused, nil
	case StatusStopped:
		return api.StateFailed, nil
	}
	timeout := b.cfg.Link.Timeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := v.link.alive(actx); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		b.log.WarnContext(ctx, "guest does not answer", "sandbox", id, "err", err)
		return api.StateFailed, nil
	}
	return api.StateRunning, nil
}

// Close drops the backend's connections to its VMs' agents, as the
// death of the edge process would. The VMs keep running.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, v := range b.vms {
		v.link.close()
	}
	return nil
}
