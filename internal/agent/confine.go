package agent

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seccompFilterFlagTSYNC applies a filter to every thread of the process.
const seccompFilterFlagTSYNC = 1

// LoadSeccomp installs a classic BPF seccomp filter (native-endian struct
// sock_filter array, as internal/seccomp encodes it) on every thread of
// the process when allThreads, else on the calling thread alone. Filters
// only ever add restrictions; no_new_privs must be set (runc sets it).
func LoadSeccomp(prog []byte, allThreads bool) error {
	if len(prog) == 0 || len(prog)%8 != 0 {
		return fmt.Errorf("seccomp: %d bytes are not a filter program", len(prog))
	}
	ins := make([]unix.SockFilter, len(prog)/8)
	for i := range ins {
		r := prog[8*i:]
		ins[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(r), Jt: r[2], Jf: r[3], K: binary.NativeEndian.Uint32(r[4:])}
	}
	fprog := unix.SockFprog{Len: uint16(len(ins)), Filter: &ins[0]}
	var flags uintptr
	if allThreads {
		flags = seccompFilterFlagTSYNC
	}
	r, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("seccomp: load filter: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("seccomp: thread %d could not be synchronized", r)
	}
	return nil
}

// dropAdmin takes CAP_SYS_ADMIN out of the calling thread's bounding,
// effective, permitted, inheritable and ambient sets, for good: what it
// forks and execs can never have it again. Capabilities are per thread;
// the agent's other threads keep theirs. If the bounding set still holds
// CAP_SYS_ADMIN afterwards, it fails: a command must never start with it.
func dropAdmin() error {
	in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, unix.CAP_SYS_ADMIN, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("read bounding set: %w", err)
	}
	if in == 1 {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0, 0, 0); err != nil {
			return fmt.Errorf("drop CAP_SYS_ADMIN from the bounding set: %w", err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	const bit = 1 << unix.CAP_SYS_ADMIN // in the first word
	if (data[0].Effective|data[0].Permitted|data[0].Inheritable)&bit != 0 {
		data[0].Effective &^= bit
		data[0].Permitted &^= bit
		data[0].Inheritable &^= bit
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return fmt.Errorf("capset: %w", err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, unix.CAP_SYS_ADMIN, 0, 0, 0); err != nil || in != 0 {
		return fmt.Errorf("CAP_SYS_ADMIN is still in the bounding set (%d, %v)", in, err)
	}
	return nil
}
