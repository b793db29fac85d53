// Package fullvm holds the tests of the fullvm backend, which is the
// microvm package's Backend in its full-VM mode (microvm.Config.FullVM):
// a q35 PC booting a vm layer's disk image with its own kernel, initrd
// and systemd, dsec-agent a unit of it, on a qcow2 overlay per sandbox.
// The two share the VMM driver, the agent link, process tracking,
// cgroups and recovery; they differ in the machine, the disk and the
// snapshot (a disk image, not a directory of changes). Its tests live in
// a package of their own so that their slow boots (tens of seconds each
// under TCG) run in a test binary of their own, beside the microVM ones.
package fullvm
