package qemu

import (
	"path/filepath"
	"strconv"

	"github.com/dsec-project/dsec/internal/backend/microvm"
	"github.com/dsec-project/dsec/internal/guestinit"
)

// fullArgs are the flags of a full VM: QEMU's q35 PC with PCI devices,
// SeaBIOS loading the image's own kernel and initrd (direct kernel boot),
// a VGA screen served over VNC on a unix socket, a USB tablet (an
// absolute pointer) and the PS/2 keyboard, the disk overlay and config
// drive as virtio-blk-pci, and the agent's virtio-serial port.
func (v *VMM) fullArgs(m *microvm.Machine) []string {
	a := []string{"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"}
	if v.accel == "kvm" {
		a = append(a, "-M", "q35", "-accel", "kvm", "-cpu", "host")
	} else {
		a = append(a, "-M", "q35", "-accel", "tcg,tb-size=64", "-cpu", "max")
	}
	a = append(a,
		"-name", "guest=dsec-"+m.ID,
		"-smp", strconv.Itoa(max(1, m.VCPUs)),
		"-m", strconv.FormatInt(m.MemoryMB, 10),
		"-kernel", m.Kernel, "-append", m.Cmdline,
		"-chardev", "file,id=console,path="+escape(filepath.Join(m.Dir, microvm.ConsoleLog)),
		"-serial", "chardev:console",
		"-chardev", "socket,id=qmp,fd=3,server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
		"-device", "VGA",
		// Relative to the machine's directory, QEMU's working directory
		// while it sets up (a sockaddr_un holds 108 bytes; the directory
		// may be longer).
		"-vnc", "unix:"+microvm.VNCSocket,
		"-device", "qemu-xhci,id=xhci", "-device", "usb-tablet,bus=xhci.0",
	)
	if m.Initrd != "" {
		a = append(a, "-initrd", m.Initrd)
	}
	for i, d := range m.Drives {
		ro := "off"
		if d.ReadOnly {
			ro = "on"
		}
		id := "drive" + strconv.Itoa(i)
		a = append(a,
			"-drive", "id="+id+",file="+escape(d.Path)+",format="+format(d)+",if=none,readonly="+ro,
			"-device", "virtio-blk-pci,drive="+id+",serial="+d.Serial)
	}
	a = append(a, "-device", "virtio-balloon-pci,free-page-reporting=on",
		"-device", "virtio-serial-pci,max_ports=2",
		"-chardev", "socket,id=agent,fd=4,server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name="+guestinit.PortName)
	return append(a, "-daemonize", "-pidfile", filepath.Join(m.Dir, microvm.PidFile))
}

func format(d microvm.Drive) string {
	if d.Format == "" {
		return "raw"
	}
	return d.Format
}
