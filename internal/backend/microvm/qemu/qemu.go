// Package qemu is the microvm backend's VMM driver for QEMU's "microvm"
// machine: no PCI, no firmware, virtio-mmio devices, a direct kernel boot.
// It runs each machine as a daemonized QEMU process in its own session
// (an edge restart never stops it), hands it pre-made listening sockets
// for the agent port and for QMP, and controls it over QMP afterwards.
// It uses KVM where a probe boot shows that KVM runs a normal guest, and
// TCG (emulation) elsewhere. It must never signal a process that is not
// the recorded QEMU (pids are pinned with pidfds and checked against their
// start time), and never leave a QEMU running after Stop.
package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-project/dsec/internal/backend/microvm"
	"github.com/dsec-project/dsec/internal/guestinit"
)

// Config configures the driver.
type Config struct {
	// Binary is qemu-system-x86_64 (found on $PATH by default).
	Binary string
	// Accel is "kvm", "tcg" or "auto" (default): KVM if a probe boot of
	// Kernel under KVM succeeds, else TCG.
	Accel string
	// Kernel is the guest kernel the probe boots.
	Kernel string
	// CacheDir keeps the probe's result across restarts (see probeKVM).
	CacheDir string
	Logger   *slog.Logger
}

// VMM is the QEMU driver.
type VMM struct {
	bin    string
	accel  string
	tscKHz int64
}

var _ microvm.VMM = (*VMM)(nil)

// New finds QEMU and settles the accelerator.
func New(ctx context.Context, cfg Config) (*VMM, error) {
	if cfg.Binary == "" {
		cfg.Binary = "qemu-system-x86_64"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	v := &VMM{bin: bin, tscKHz: hostTSCKHz()}
	switch cfg.Accel {
	case "kvm", "tcg":
		v.accel = cfg.Accel
	case "", "auto":
		v.accel = "tcg"
		if ok, why := probeKVM(ctx, bin, cfg.Kernel, cfg.CacheDir); ok {
			v.accel = "kvm"
		} else {
			cfg.Logger.InfoContext(ctx, "microvm: KVM cannot run a guest here; using TCG emulation", "reason", why)
		}
	default:
		return nil, fmt.Errorf("qemu: unknown accelerator %q (want kvm, tcg or auto)", cfg.Accel)
	}
	return v, nil
}

// Name implements microvm.VMM.
func (v *VMM) Name() string { return "qemu" }

// Accel implements microvm.VMM.
func (v *VMM) Accel() string { return v.accel }

// machineArgs are the flags common to sandboxes and the KVM probe.
func machineArgs(accel string) []string {
	a := []string{"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"}
	if accel == "kvm" {
		return append(a, "-M", "microvm,rtc=on", "-accel", "kvm", "-cpu", "host")
	}
	// Under TCG the guest has no kvmclock: it needs the PIT and RTC, and
	// the TSC frequency on its command line (see cmdline). The translated
	// code cache is capped at 32 MiB: by default it grows to hold all code
	// ever run (60 MiB resident per idle guest), and it is per VM.
	return append(a, "-M", "microvm,pit=on,pic=on,rtc=on", "-accel", "tcg,tb-size=32", "-cpu", "max")
}

// cmdline adds what the accelerator needs to the machine's command line.
// Under TCG the guest's TSC runs at the host's rate, but the guest cannot
// calibrate it (no HPET or PM timer on microvm, and PIT calibration
// fails under emulation, hanging the boot): it is told the rate.
func (v *VMM) cmdline(base string) string {
	if v.accel == "kvm" {
		return base
	}
	extra := " tsc=reliable no_timer_check"
	if v.tscKHz > 0 {
		extra += " tsc_early_khz=" + strconv.FormatInt(v.tscKHz, 10)
	}
	return base + extra
}

func (v *VMM) args(m *microvm.Machine) []string {
	if m.Type == microvm.TypeQ35 {
		return v.fullArgs(m)
	}
	a := machineArgs(v.accel)
	a = append(a,
		"-name", "guest=dsec-"+m.ID,
		"-smp", strconv.Itoa(max(1, m.VCPUs)),
		"-m", strconv.FormatInt(m.MemoryMB, 10),
		"-kernel", m.Kernel, "-initrd", m.Initrd, "-append", v.cmdline(m.Cmdline),
		"-chardev", "file,id=console,path="+escape(filepath.Join(m.Dir, microvm.ConsoleLog)),
		"-serial", "chardev:console",
		"-chardev", "socket,id=qmp,fd=3,server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
	)
	for i, d := range m.Drives {
		ro := "off"
		if d.ReadOnly {
			ro = "on"
		}
		id := "drive" + strconv.Itoa(i)
		a = append(a,
			"-drive", "id="+id+",file="+escape(d.Path)+",format="+format(d)+",if=none,readonly="+ro,
			"-device", "virtio-blk-device,drive="+id+",serial="+d.Serial)
	}
	// Free page reporting: pages the guest frees (the boot's decompression
	// buffers, the unpacked initramfs, a finished build's memory) are
	// handed back to the host instead of staying resident in the VMM.
	a = append(a, "-device", "virtio-balloon-device,free-page-reporting=on")
	switch m.Transport {
	case guestinit.TransportVsock:
		a = append(a, "-device", "vhost-vsock-device,guest-cid="+strconv.FormatUint(uint64(m.CID), 10))
	default:
		a = append(a,
			"-device", "virtio-serial-device,max_ports=2",
			"-chardev", "socket,id=agent,fd=4,server=on,wait=off",
			"-device", "virtserialport,chardev=agent,name="+guestinit.PortName)
	}
	return append(a, "-daemonize", "-pidfile", filepath.Join(m.Dir, microvm.PidFile))
}

// escape doubles commas, QEMU's option separator.
func escape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// Start implements microvm.VMM. QEMU daemonizes once every device is set
// up, so errors in the configuration come back here, and the daemon is
// not our child: it lives on when the edge dies.
func (v *VMM) Start(ctx context.Context, m *microvm.Machine) (microvm.Process, error) {
	return v.start(ctx, m)
}

// start starts QEMU for m with extra arguments.
func (v *VMM) start(ctx context.Context, m *microvm.Machine, extra ...string) (microvm.Process, error) {
	qmpL, err := microvm.ListenUnix(filepath.Join(m.Dir, microvm.ControlSock))
	if err != nil {
		return microvm.Process{}, err
	}
	defer qmpL.Close()
	files := []*os.File{qmpL}
	if m.Transport != guestinit.TransportVsock {
		agentL, err := microvm.ListenUnix(filepath.Join(m.Dir, microvm.AgentSocket))
		if err != nil {
			return microvm.Process{}, err
		}
		defer agentL.Close()
		files = append(files, agentL)
	}
	pidFile := filepath.Join(m.Dir, microvm.PidFile)
	os.Remove(pidFile)
	cmd := exec.CommandContext(ctx, v.bin, append(v.args(m), extra...)...)
	cmd.ExtraFiles = files
	if m.Type == microvm.TypeQ35 {
		cmd.Dir = m.Dir // where its VNC socket goes, by a short relative name
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		// If the daemon got as far as writing its pid, it must not live on.
		if p, perr := readPid(pidFile); perr == nil {
			p.Kill(context.WithoutCancel(ctx))
		}
		return microvm.Process{}, fmt.Errorf("start qemu: %w: %s", err, strings.TrimSpace(out.String()))
	}
	p, err := readPid(pidFile)
	if err != nil {
		return microvm.Process{}, fmt.Errorf("start qemu: %w", err)
	}
	return p, nil
}

func readPid(path string) (microvm.Process, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return microvm.Process{}, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return microvm.Process{}, fmt.Errorf("pid file %s: %w", path, err)
	}
	return microvm.ProcessOf(pid)
}

// Stop implements microvm.VMM: SIGKILL, which nothing in the guest can
// delay. The guest's disks are throw-away or read-only.
func (v *VMM) Stop(ctx context.Context, m *microvm.Machine, p microvm.Process) error {
	return p.Kill(ctx)
}

// Pause implements microvm.VMM.
func (v *VMM) Pause(ctx context.Context, m *microvm.Machine, p microvm.Process) error {
	return v.control(ctx, m, p, "stop", nil, nil)
}

// Resume implements microvm.VMM.
func (v *VMM) Resume(ctx context.Context, m *microvm.Machine, p microvm.Process) error {
	return v.control(ctx, m, p, "cont", nil, nil)
}

// Booted implements microvm.VMM: the console moves from its file to a
// 64 KiB ring in QEMU's memory, so that a guest writing to its serial port
// without end cannot fill the node's disk. The file keeps the boot log.
func (v *VMM) Booted(ctx context.Context, m *microvm.Machine, p microvm.Process) error {
	return v.control(ctx, m, p, "chardev-change", map[string]any{
		"id":      "console",
		"backend": map[string]any{"type": "ringbuf", "data": map[string]any{"size": 64 << 10}},
	}, nil)
}

// Status implements microvm.VMM.
func (v *VMM) Status(ctx context.Context, m *microvm.Machine, p microvm.Process) (microvm.Status, error) {
	if !p.Alive() {
		return microvm.StatusStopped, nil
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := v.control(ctx, m, p, "query-status", nil, &st); err != nil {
		var qe *qmpError
		if errors.As(err, &qe) {
			return "", err
		}
		// A VMM that cannot be reached on its control socket is exiting
		// (the socket is closed or reset) or hung (no answer).
		return microvm.StatusStopped, nil
	}
	switch st.Status {
	case "running":
		return microvm.StatusRunning, nil
	case "paused", "suspended", "prelaunch", "inmigrate", "postmigrate", "finish-migrate", "save-vm", "restore-vm":
		return microvm.StatusPaused, nil
	}
	// shutdown, guest-panicked, internal-error, io-error, watchdog, debug
	return microvm.StatusStopped, nil
}

func (v *VMM) control(ctx context.Context, m *microvm.Machine, p microvm.Process, cmd string, args, out any) error {
	if !p.Alive() {
		return fmt.Errorf("qemu %s of %s: %w", cmd, m.ID, errGone)
	}
	return qmp(ctx, filepath.Join(m.Dir, microvm.ControlSock), cmd, args, out)
}

var errGone = errors.New("the machine's process is gone")

// hostTSCKHz is the host's TSC rate, which a TCG guest's TSC runs at. On
// x86 Linux with a known TSC frequency /proc/cpuinfo's "cpu MHz" is it.
func hostTSCKHz() int64 {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0
			}
			return int64(mhz * 1000)
		}
	}
	return 0
}

// waitTimeout bounds a probe boot.
const probeTimeout = 15 * time.Second
