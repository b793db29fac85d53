// Package vmimage makes and reads the disk images of `vm` layers, which
// the fullvm backend boots: a whole disk with its own kernel, initrd and
// init (systemd), and dsec-agent installed as a systemd unit that serves
// the agent API on the VM's virtio-serial port.
//
// Build turns a Debian tree (debootstrap with a kernel package and
// systemd) into such a disk: a partitionless ext4 file system, stored as
// qcow2. Inspect finds how to boot a disk (its kernel and initrd, copied
// out of the image once per node, and the root device); a disk it cannot
// boot is refused with errdefs.ErrInvalid.
//
// This package must never mount a disk image or run anything of it: the
// kernel and initrd are read out with debugfs, as files.
package vmimage

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// AgentPath is where Build installs dsec-agent in the image.
const AgentPath = "/usr/local/sbin/dsec-agent"

// agentUnit starts the agent once the system is up: commands see a booted
// system (udev settled, tmpfiles made), the same after every boot.
const agentUnit = `[Unit]
Description=dsec agent: the sandbox API over the host link
After=multi-user.target
ConditionPathExists=` + AgentPath + `

[Service]
ExecStart=` + AgentPath + ` --vm-service
Restart=always
RestartSec=1s

[Install]
WantedBy=multi-user.target
`

// autologin gives the console on the screen (tty1) a root shell, so that
// a person or an agent at the screen can type commands.
const autologin = `[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --noclear %I $TERM
`

// Units Build masks: timers and first-boot questions that only slow a
// sandbox's boot or wait for an answer on the console.
var masked = []string{
	"apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "e2scrub_reap.service",
	"fstrim.timer", "systemd-firstboot.service", "man-db.timer",
}

// Options of Build.
type Options struct {
	// Tree is a root file system with a kernel in /boot and systemd; Build
	// adds its files to it.
	Tree string
	// Agent is the static dsec-agent binary to install.
	Agent string
	// Out is the qcow2 image to write.
	Out string
	// SizeMB is the disk's size; 0 sizes it to the tree plus room to work
	// (a sandbox's disk grows to its resources' disk_mb at boot).
	SizeMB int64
	// Autologin logs root in on the screen's console (tty1).
	Autologin bool
}

// Build prepares opts.Tree as a full VM's root and writes it as a qcow2
// disk image.
func Build(ctx context.Context, opts Options) error {
	if _, err := findKernel(opts.Tree); err != nil {
		return err
	}
	if err := install(opts); err != nil {
		return err
	}
	if err := slimInitramfs(ctx, opts.Tree); err != nil {
		return err
	}
	size := opts.SizeMB
	if size == 0 {
		used, err := duMB(ctx, opts.Tree)
		if err != nil {
			return err
		}
		size = used + used/4 + 512
	}
	raw := opts.Out + ".raw"
	os.Remove(raw)
	defer os.Remove(raw)
	if err := run(ctx, "mke2fs", "-q", "-t", "ext4", "-L", "dsec-root", "-E", "root_owner=0:0",
		"-d", opts.Tree, raw, strconv.FormatInt(size, 10)+"M"); err != nil {
		return err
	}
	tmp := opts.Out + ".tmp"
	defer os.Remove(tmp)
	if err := run(ctx, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, opts.Out)
}

// install writes the agent, its unit, the file system table and the
// settings of a sandbox into the tree.
func install(opts Options) error {
	t := opts.Tree
	agent, err := os.ReadFile(opts.Agent)
	if err != nil {
		return fmt.Errorf("vm image: agent: %w", err)
	}
	id := make([]byte, 16)
	rand.Read(id)
	files := []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{AgentPath, agent, 0o755},
		{"/etc/systemd/system/dsec-agent.service", []byte(agentUnit), 0o644},
		// x-systemd.growfs: the root grows to the disk's size at boot.
		{"/etc/fstab", []byte("LABEL=dsec-root / ext4 rw,errors=remount-ro,x-systemd.growfs 0 1\n"), 0o644},
		{"/etc/hostname", []byte("dsec\n"), 0o644},
		{"/etc/hosts", []byte("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"), 0o644},
		{"/etc/machine-id", []byte(hex.EncodeToString(id) + "\n"), 0o444},
	}
	if opts.Autologin {
		files = append(files, struct {
			path string
			data []byte
			mode os.FileMode
		}{"/etc/systemd/system/getty@tty1.service.d/autologin.conf", []byte(autologin), 0o644})
	}
	for _, f := range files {
		p := filepath.Join(t, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("vm image: %w", err)
		}
		os.Remove(p)
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			return fmt.Errorf("vm image: %w", err)
		}
	}
	links := map[string]string{
		"/etc/systemd/system/multi-user.target.wants/dsec-agent.service": "/etc/systemd/system/dsec-agent.service",
	}
	for _, u := range masked {
		links["/etc/systemd/system/"+u] = "/dev/null"
	}
	for l, target := range links {
		p := filepath.Join(t, l)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.Remove(p)
		if err := os.Symlink(target, p); err != nil {
			return fmt.Errorf("vm image: %w", err)
		}
	}
	return nil
}

// initramfsConf makes the initrd hold only what mounts the root of a
// full VM (virtio PCI and block, and ext4): a third of the default size,
// and no module probing at boot, which under emulation takes tens of
// seconds.
const initramfsConf = "MODULES=list\nCOMPRESS=gzip\n"

// initramfsModules are the initrd's modules. ext4 is built into Debian's
// cloud kernel but a module of its generic one (linux-image-amd64, which
// the desktop image needs for its DRM screen driver): without it the
// initrd cannot mount the root ("mount: No such device") and the guest
// reboots. A module built into the kernel is skipped by initramfs-tools.
var initramfsModules = []string{"virtio_pci", "virtio_blk", "ext4"}

// slimInitramfs rebuilds the tree's initrds (initramfs-tools) with
// initramfsConf; a tree without initramfs-tools keeps what it has.
func slimInitramfs(ctx context.Context, tree string) error {
	if _, err := os.Stat(filepath.Join(tree, "usr/sbin/update-initramfs")); err != nil {
		return nil
	}
	conf := filepath.Join(tree, "etc/initramfs-tools")
	if err := os.WriteFile(filepath.Join(conf, "conf.d", "dsec.conf"), []byte(initramfsConf), 0o644); err != nil {
		return fmt.Errorf("vm image: %w", err)
	}
	mods, _ := os.ReadFile(filepath.Join(conf, "modules"))
	for _, m := range initramfsModules {
		if !strings.Contains("\n"+string(mods), "\n"+m+"\n") {
			mods = append(mods, []byte(m+"\n")...)
		}
	}
	if err := os.WriteFile(filepath.Join(conf, "modules"), mods, 0o644); err != nil {
		return fmt.Errorf("vm image: %w", err)
	}
	if err := run(ctx, "chroot", tree, "update-initramfs", "-u", "-k", "all"); err != nil {
		return fmt.Errorf("vm image: %w", err)
	}
	return nil
}

// findKernel finds the newest kernel in a tree's /boot.
func findKernel(tree string) (string, error) {
	ms, _ := filepath.Glob(filepath.Join(tree, "boot", "vmlinuz-*"))
	if len(ms) == 0 {
		return "", fmt.Errorf("vm image: %s has no kernel in /boot (install a linux-image package)", tree)
	}
	return ms[len(ms)-1], nil
}

func duMB(ctx context.Context, dir string) (int64, error) {
	out, err := exec.CommandContext(ctx, "du", "-sxm", dir).Output()
	if err != nil {
		return 0, fmt.Errorf("du %s: %w", dir, err)
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return 0, fmt.Errorf("du %s: no output", dir)
	}
	return strconv.ParseInt(f[0], 10, 64)
}

func run(ctx context.Context, name string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(lastBytes(out.Bytes(), 2048)))
	}
	return nil
}

func lastBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
