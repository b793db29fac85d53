package vmimage

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// Disk formats of a vm layer.
const (
	FormatQcow2 = "qcow2"
	FormatRaw   = "raw"
)

// Boot is how to boot a disk image: its format, the kernel and initrd
// copied out of it, and the root device the kernel mounts.
type Boot struct {
	Format string `json:"format"`
	// VirtualMB is the disk's size.
	VirtualMB int64  `json:"virtual_mb"`
	Kernel    string `json:"kernel"`
	// Version is the kernel's release (what uname -r shows in the guest).
	Version string `json:"version"`
	Initrd  string `json:"initrd,omitempty"`
	// Root is the root device as the guest names it: /dev/vda (a
	// partitionless disk) or /dev/vdaN.
	Root string `json:"root"`
}

// DetectFormat tells a qcow2 image from a raw disk by its first bytes; a
// raw disk must hold an ext4 file system or an MBR partition table.
func DetectFormat(head []byte) (string, error) {
	switch {
	case len(head) >= 4 && bytes.Equal(head[:4], []byte("QFI\xfb")):
		return FormatQcow2, nil
	case len(head) >= 1082 && binary.LittleEndian.Uint16(head[1080:]) == 0xef53:
		return FormatRaw, nil
	case len(head) >= 512 && head[510] == 0x55 && head[511] == 0xaa:
		return FormatRaw, nil
	}
	return "", errdefs.Invalid("a vm layer is a disk image: qcow2, or a raw disk holding an ext4 file system or an MBR partition table")
}

// Inspect finds how to boot the disk image at path, copying its kernel and
// initrd into dir (once: a dir that has them is reused). A disk without a
// kernel in /boot of its root file system is not bootable:
// errdefs.ErrInvalid.
func Inspect(ctx context.Context, path, dir string) (Boot, error) {
	info := filepath.Join(dir, "boot.json")
	if b, err := os.ReadFile(info); err == nil {
		var bt Boot
		if json.Unmarshal(b, &bt) == nil {
			return bt, nil
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return Boot{}, err
	}
	head := make([]byte, 4096)
	n, _ := f.ReadAt(head, 0)
	f.Close()
	format, err := DetectFormat(head[:n])
	if err != nil {
		return Boot{}, err
	}
	var qi struct {
		Format      string `json:"format"`
		VirtualSize int64  `json:"virtual-size"`
		Backing     string `json:"backing-filename"`
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "-U", "--output=json", "-f", format, path).Output()
	if err != nil {
		return Boot{}, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	if err := json.Unmarshal(out, &qi); err != nil {
		return Boot{}, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	if qi.Backing != "" {
		return Boot{}, errdefs.Invalid("a vm layer is a whole disk: this qcow2 image has a backing file")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Boot{}, err
	}
	// debugfs reads a raw file system: a qcow2 disk is converted to a
	// sparse raw file first, and removed after.
	raw := path
	if format == FormatQcow2 {
		raw = filepath.Join(dir, "disk.raw")
		defer os.Remove(raw)
		if err := run(ctx, "qemu-img", "convert", "-U", "-f", "qcow2", "-O", "raw", path, raw); err != nil {
			return Boot{}, err
		}
	}
	root, offset, err := rootOf(raw)
	if err != nil {
		return Boot{}, err
	}
	fsPath := raw
	if offset > 0 {
		fsPath = raw + "?offset=" + strconv.FormatInt(offset, 10)
	}
	ls, err := debugfs(ctx, fsPath, "ls -p /boot")
	if err != nil {
		return Boot{}, errdefs.Invalid("the vm image's root file system cannot be read (%v): not a bootable disk", err)
	}
	var kernels, initrds []string
	for _, line := range strings.Split(ls, "\n") {
		// /inode/mode/uid/gid/name/size/
		fields := strings.Split(line, "/")
		if len(fields) < 7 {
			continue
		}
		name := fields[5]
		switch {
		case strings.HasPrefix(name, "vmlinuz-"):
			kernels = append(kernels, strings.TrimPrefix(name, "vmlinuz-"))
		case strings.HasPrefix(name, "initrd.img-"):
			initrds = append(initrds, strings.TrimPrefix(name, "initrd.img-"))
		}
	}
	if len(kernels) == 0 {
		return Boot{}, errdefs.Invalid("the vm image has no kernel in /boot (vmlinuz-*): it is not bootable")
	}
	slices.Sort(kernels)
	version := kernels[len(kernels)-1]
	bt := Boot{Format: format, VirtualMB: qi.VirtualSize >> 20, Root: root, Kernel: filepath.Join(dir, "vmlinuz"), Version: version}
	if _, err := debugfs(ctx, fsPath, "dump /boot/vmlinuz-"+version+" "+bt.Kernel); err != nil {
		return Boot{}, err
	}
	if st, err := os.Stat(bt.Kernel); err != nil || st.Size() == 0 {
		return Boot{}, errdefs.Invalid("the vm image's kernel /boot/vmlinuz-%s cannot be read: it is not bootable", version)
	}
	if slices.Contains(initrds, version) {
		bt.Initrd = filepath.Join(dir, "initrd.img")
		if _, err := debugfs(ctx, fsPath, "dump /boot/initrd.img-"+version+" "+bt.Initrd); err != nil {
			return Boot{}, err
		}
	}
	b, _ := json.Marshal(bt)
	if err := os.WriteFile(info+".tmp", b, 0o600); err != nil {
		return Boot{}, err
	}
	return bt, os.Rename(info+".tmp", info)
}

// rootOf finds the root file system of a raw disk: the disk itself if it
// is ext4, else the first Linux partition of its MBR.
func rootOf(raw string) (dev string, offset int64, err error) {
	f, err := os.Open(raw)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	head := make([]byte, 2048)
	if _, err := f.ReadAt(head, 0); err != nil {
		return "", 0, fmt.Errorf("read %s: %w", raw, err)
	}
	if binary.LittleEndian.Uint16(head[1080:]) == 0xef53 {
		return "/dev/vda", 0, nil
	}
	if head[510] == 0x55 && head[511] == 0xaa {
		for i := range 4 {
			e := head[446+16*i : 446+16*(i+1)]
			if e[4] == 0x83 { // Linux
				lba := int64(binary.LittleEndian.Uint32(e[8:]))
				return "/dev/vda" + strconv.Itoa(i+1), lba * 512, nil
			}
		}
		if head[446+4] == 0xee {
			return "", 0, errdefs.Invalid("the vm image has a GPT partition table: give a partitionless ext4 disk or an MBR disk")
		}
	}
	return "", 0, errdefs.Invalid("the vm image has no ext4 root file system and no Linux MBR partition: it is not bootable")
}

func debugfs(ctx context.Context, fs, request string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "debugfs", "-R", request, fs)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("debugfs %q: %w: %s", request, err, strings.TrimSpace(stderr.String()))
	}
	// debugfs reports a missing file on stderr and exits 0.
	if s := stderr.String(); strings.Contains(s, "File not found") || strings.Contains(s, "Bad magic") {
		return "", errors.New(strings.TrimSpace(s))
	}
	return string(out), nil
}
