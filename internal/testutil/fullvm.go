package testutil

import (
	"fmt"
	"os"
	"path/filepath"
)

// VMImagePath is the small bootable vm image `make vm-image` builds
// (bin/vm-debian-12.qcow2: debootstrap minbase bookworm, the cloud
// kernel, systemd, dsec-agent as a unit), or $DSEC_VM_IMAGE.
func VMImagePath() string {
	if p := os.Getenv("DSEC_VM_IMAGE"); p != "" {
		return p
	}
	return filepath.Join(RepoRoot(), "bin", "vm-debian-12.qcow2")
}

// VMImage requires the vm image (make vm-image).
func VMImage() string {
	if _, err := os.Stat(VMImagePath()); err != nil {
		return fmt.Sprintf("needs the vm image %s (make vm-image)", VMImagePath())
	}
	return ""
}

// FullVMRequirements are what a full VM sandbox needs from the machine.
var FullVMRequirements = []Requirement{Root, Tool("qemu-system-x86_64"), Tool("qemu-img"), Tool("debugfs"), VMImage}
