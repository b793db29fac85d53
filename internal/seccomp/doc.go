// Package seccomp compiles an OCI seccomp profile (Docker's default, as
// moby/profiles resolves it for a capability set) to a classic BPF program
// in pure Go, with the decisions runc 1.1 and libseccomp 2.5 would load for
// the same profile on x86_64 (with its x86 and x32 sub-architectures):
// the same name resolution, the same argument comparisons (64-bit on
// x86_64, the low 32 bits on x86 and x32), x86's multiplexed socketcall
// and ipc rules, and runc's ENOSYS answer for system calls newer than the
// profile. The edge compiles once per node; the agent loads the result.
//
// It must never load a program into the calling process, and never
// produce a program whose decisions differ from runc's for the same
// profile: TestSameDecisionsAsRunc compares them on every system call
// number of every architecture.
package seccomp

//go:generate go run mktables.go
