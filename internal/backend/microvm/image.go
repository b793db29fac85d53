package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/dsec-project/dsec/internal/initramfs"
)

// guestModules are what the guest's init loads: the virtio-mmio bus, block
// devices (layers, the writable disk, the config drive), the serial port
// of the agent link, the balloon (free page reporting: memory the guest
// frees goes back to the host), and the filesystems of the root. ext4 is
// built into Debian's cloud kernel; were it a module it would be loaded too.
var guestModules = []string{"virtio_mmio", "virtio_blk", "virtio_console", "virtio_balloon", "erofs", "overlay"}

var vsockModules = []string{"vmw_vsock_virtio_transport"}

// initramfsFormat changes whenever what Build puts in the archive changes.
const initramfsFormat = "2"

// buildInitramfs builds (once per agent binary and kernel) the initramfs
// every microVM of this node boots, into dir, and returns its path.
func buildInitramfs(dir, agent string, k initramfs.Kernel, vsock bool) (string, error) {
	mods := guestModules
	if vsock {
		mods = append(append([]string{}, mods...), vsockModules...)
	}
	h := sha256.New()
	f, err := os.Open(agent)
	if err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	fmt.Fprintf(h, "\x00%s\x00%s\x00%s", initramfsFormat, k.Version, strings.Join(mods, ","))
	path := filepath.Join(dir, hex.EncodeToString(h.Sum(nil))[:16]+".cpio")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := initramfs.Build(tmp, initramfs.Config{Init: agent, Kernel: k, Modules: mods}); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	return path, nil
}

// pruneImages removes initramfs images no sandbox boots from any more.
func pruneImages(dir string, keep map[string]bool) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if p := filepath.Join(dir, e.Name()); !keep[p] {
			os.RemoveAll(p) // a full VM's kernel and initrd are a directory
		}
	}
}

// makeWritableDisk creates the guest's writable disk: a sparse file of
// sizeMB holding an empty ext4 filesystem (the overlay's upper and work
// dirs live on it). Only written blocks take space on the node.
func makeWritableDisk(ctx context.Context, path string, sizeMB int64) error {
	os.Remove(path)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("writable disk: %w", err)
	}
	err = f.Truncate(sizeMB << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writable disk: %w", err)
	}
	// lazy_*_init leaves inode tables and the journal to be zeroed on
	// first use; nodiscard keeps mkfs from punching the whole file.
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", "-L", "dsec-rw", path)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("writable disk: mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
