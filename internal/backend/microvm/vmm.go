package microvm

import (
	"context"
)

// VMM drives one hypervisor: QEMU's microvm machine today (package qemu);
// Firecracker or Cloud Hypervisor fit the same interface. A VMM starts a
// machine as a process of its own that outlives the caller (an edge
// restart never stops a sandbox) and controls it afterwards from what the
// Machine and its Process record, so that a restarted edge can take over.
type VMM interface {
	// Name identifies the VMM ("qemu").
	Name() string
	// Accel is the accelerator machines run with: "kvm" or "tcg".
	Accel() string
	// Start boots m and returns once its process runs and holds its
	// sockets; it does not wait for the guest. On error nothing runs.
	Start(ctx context.Context, m *Machine) (Process, error)
	// Stop kills the machine's process and waits until it is gone. A
	// process that is already gone is not an error.
	Stop(ctx context.Context, m *Machine, p Process) error
	// Pause and Resume freeze and thaw the guest's vCPUs.
	Pause(ctx context.Context, m *Machine, p Process) error
	Resume(ctx context.Context, m *Machine, p Process) error
	// Status reports the machine's state.
	Status(ctx context.Context, m *Machine, p Process) (Status, error)
	// Booted is called once the guest's agent answers: the VMM may stop
	// recording boot output (QEMU moves the console to a bounded ring).
	Booted(ctx context.Context, m *Machine, p Process) error
	// SaveState stops the guest's vCPUs and writes its RAM and device
	// state to path; the machine stays stopped (Resume continues it).
	SaveState(ctx context.Context, m *Machine, p Process, path string) error
	// Restore starts m from the state SaveState wrote at path and returns
	// once the restored guest runs. m has the devices of the machine that
	// saved it, in the same order (its disks may be copies).
	Restore(ctx context.Context, m *Machine, path string) (Process, error)
}

// Status of a machine.
type Status string

const (
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	// StatusStopped: the process is gone, or the guest shut down, panicked
	// or hit an error the VMM cannot recover from.
	StatusStopped Status = "stopped"
)

// Machine is everything a VMM needs to run a microVM. It is stored with
// the sandbox, so fields are only ever added.
type Machine struct {
	ID string `json:"id"`
	// Type is "" for QEMU's microvm machine (virtio-mmio, our initramfs)
	// or TypeQ35 for a full PC (PCI, firmware, a VGA screen, USB tablet)
	// booting a vm layer's own kernel and init.
	Type string `json:"type,omitempty"`
	// Dir holds the machine's sockets, pid file and console log.
	Dir     string `json:"dir"`
	Kernel  string `json:"kernel"`
	Initrd  string `json:"initrd"`
	Cmdline string `json:"cmdline"`
	VCPUs   int    `json:"vcpus"`
	// MemoryMB is the guest's RAM.
	MemoryMB int64   `json:"memory_mb"`
	Drives   []Drive `json:"drives"`
	// Transport is how the host reaches the agent: "serial" (a
	// virtio-serial port named guestinit.PortName behind the unix socket
	// AgentSocket) or "vsock" (guest CID, agent port in the guest config).
	Transport string `json:"transport"`
	CID       uint32 `json:"cid,omitempty"`
}

// Drive is a virtio block device.
type Drive struct {
	Path     string `json:"path"`
	Serial   string `json:"serial"`
	ReadOnly bool   `json:"read_only"`
	// Format is "raw" (the default) or "qcow2".
	Format string `json:"format,omitempty"`
}

// TypeQ35 is the Machine.Type of a full VM.
const TypeQ35 = "q35"

// Files in a machine's directory.
const (
	AgentSocket = "agent.sock"
	ControlSock = "control.sock" // the VMM's control API (QMP for QEMU)
	ConsoleLog  = "console.log"
	PidFile     = "vmm.pid"
	// VNCSocket is a full VM's VNC server (its screen, keyboard, mouse).
	VNCSocket = "vnc.sock"
)

// Process identifies a machine's VMM process: the pid and its start time
// (field 22 of /proc/PID/stat), so that a reused pid is never mistaken
// for it.
type Process struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}
