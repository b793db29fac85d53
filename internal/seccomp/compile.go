package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// noSyscall marks a name that has no number on an architecture.
const noSyscall = -1 << 40

// x32Bit marks an x32 system call number (__X32_SYSCALL_BIT).
const x32Bit = 1 << 30

// Return values of a filter (linux/seccomp.h).
const (
	retKillProcess = 0x80000000
	retKillThread  = 0x00000000
	retTrap        = 0x00030000
	retErrno       = 0x00050000
	retLog         = 0x7ffc0000
	retAllow       = 0x7fff0000
)

// Offsets in struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// arch is one architecture of a filter, as libseccomp sees it.
type arch struct {
	oci   specs.Arch
	audit uint32
	col   int  // column of libseccompNames
	bits  uint // compared width of arguments: libseccomp's arch size
	base  uint32
}

var x86Family = []arch{
	{oci: specs.ArchX86_64, audit: unix.AUDIT_ARCH_X86_64, col: 0, bits: 64},
	{oci: specs.ArchX86, audit: unix.AUDIT_ARCH_I386, col: 1, bits: 32},
	{oci: specs.ArchX32, audit: unix.AUDIT_ARCH_X86_64, col: 2, bits: 32, base: x32Bit},
}

// Program is a compiled filter: struct sock_filter instructions.
type Program []bpf.RawInstruction

// MarshalBinary encodes the program as the kernel reads it (native-endian
// struct sock_filter array): what the agent hands to seccomp(2).
func (p Program) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, 8*len(p))
	for _, i := range p {
		b = binary.NativeEndian.AppendUint16(b, i.Op)
		b = append(b, i.Jt, i.Jf)
		b = binary.NativeEndian.AppendUint32(b, i.K)
	}
	return b, nil
}

// Unmarshal decodes what MarshalBinary encoded.
func Unmarshal(b []byte) (Program, error) {
	if len(b)%8 != 0 || len(b) == 0 || len(b)/8 > maxInsns {
		return nil, fmt.Errorf("seccomp: %d bytes are not a filter program", len(b))
	}
	p := make(Program, len(b)/8)
	for i := range p {
		r := b[8*i:]
		p[i] = bpf.RawInstruction{Op: binary.NativeEndian.Uint16(r), Jt: r[2], Jf: r[3], K: binary.NativeEndian.Uint32(r[4:])}
	}
	return p, nil
}

// rule is one libseccomp rule of a system call: its action when every
// condition holds.
type rule struct {
	action uint32
	conds  []specs.LinuxSeccompArg
}

// Compile compiles a profile for an x86_64 node with the decisions runc
// 1.1 and libseccomp 2.5 give it. Only the x86 family of architectures,
// and the actions ALLOW, ERRNO, KILL*, TRAP and LOG, are supported.
func Compile(p *specs.LinuxSeccomp) (Program, error) {
	if p == nil {
		return nil, errors.New("seccomp: no profile")
	}
	if len(p.Flags) > 0 || p.ListenerPath != "" {
		return nil, errors.New("seccomp: filter flags and listeners are not supported")
	}
	def, err := action(p.DefaultAction, p.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("seccomp: default action: %w", err)
	}
	var archs []arch
	for _, a := range x86Family {
		if a.oci == specs.ArchX86_64 || slices.Contains(p.Architectures, a.oci) {
			archs = append(archs, a) // libseccomp always has the native arch
		}
	}
	for _, a := range p.Architectures {
		if !slices.ContainsFunc(archs, func(x arch) bool { return x.oci == a }) {
			return nil, fmt.Errorf("seccomp: architecture %s is not supported", a)
		}
	}
	rules := make([]map[int64][]rule, len(archs))
	last := make([]int64, len(archs))
	for i, a := range archs {
		if rules[i], last[i], err = archRules(p, a); err != nil {
			return nil, err
		}
	}
	// runc answers ENOSYS to system calls newer than the profile, so that
	// C libraries fall back to older ones, unless the default allows.
	stub := p.DefaultAction != specs.ActAllow && p.DefaultAction != specs.ActLog &&
		(p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != uint(unix.ENOSYS))

	var a asm
	sections := make([]label, len(archs))
	for i := range archs {
		sections[i] = a.label()
	}
	a.load(offArch)
	x64 := a.label()
	a.jump(bpf.JumpEqual, unix.AUDIT_ARCH_X86_64, x64, next)
	for i, ar := range archs {
		if ar.audit != unix.AUDIT_ARCH_X86_64 {
			a.farJump(bpf.JumpEqual, ar.audit, sections[i])
		}
	}
	a.ret(retKillThread) // libseccomp's default for a foreign architecture
	a.mark(x64)
	a.load(offNr)
	x32 := slices.IndexFunc(archs, func(x arch) bool { return x.oci == specs.ArchX32 })
	if x32 >= 0 {
		a.farJump(bpf.JumpBitsSet, x32Bit, sections[x32])
		a.goTo(sections[0])
	} else {
		a.jump(bpf.JumpBitsSet, x32Bit, next, sections[0])
		a.ret(def)
	}
	for i, ar := range archs {
		a.mark(sections[i])
		if ar.audit != unix.AUDIT_ARCH_X86_64 {
			a.load(offNr)
		}
		if err := section(&a, ar, rules[i], def, stub, last[i]); err != nil {
			return nil, err
		}
	}
	return a.assemble()
}

// action is the filter return value of an OCI action.
func action(act specs.LinuxSeccompAction, errno *uint) (uint32, error) {
	switch act {
	case specs.ActAllow:
		return retAllow, nil
	case specs.ActErrno:
		e := uint(unix.EPERM) // runc's default
		if errno != nil {
			e = *errno
		}
		return retErrno | uint32(e&0xffff), nil
	case specs.ActKill, specs.ActKillThread:
		return retKillThread, nil
	case specs.ActKillProcess:
		return retKillProcess, nil
	case specs.ActTrap:
		return retTrap, nil
	case specs.ActLog:
		return retLog, nil
	}
	return 0, fmt.Errorf("action %s is not supported", act)
}

// archRules resolves the profile's rules on one architecture, as runc and
// libseccomp do, and returns the highest system call number it names.
func archRules(p *specs.LinuxSeccomp, a arch) (map[int64][]rule, int64, error) {
	out := map[int64][]rule{}
	last := int64(-1)
	for _, sc := range p.Syscalls {
		act, err := action(sc.Action, sc.ErrnoRet)
		if err != nil {
			return nil, 0, fmt.Errorf("seccomp: %v: %w", sc.Names, err)
		}
		// runc: when one argument has several conditions, each condition
		// becomes a rule of its own (an OR); otherwise one rule ANDs them.
		groups := [][]specs.LinuxSeccompArg{sc.Args}
		seen := map[uint]bool{}
		for _, c := range sc.Args {
			if seen[c.Index] {
				groups = nil
				for _, c := range sc.Args {
					groups = append(groups, []specs.LinuxSeccompArg{c})
				}
				break
			}
			seen[c.Index] = true
		}
		for _, name := range sc.Names {
			nums, ok := libseccompNames[name]
			if !ok || nums[0] == noSyscall && nums[1] == noSyscall && nums[2] == noSyscall {
				continue // runc ignores names libseccomp does not know
			}
			nr := nums[a.col]
			if nr == noSyscall {
				continue
			}
			if nr >= 0 {
				last = max(last, nr)
			}
			for _, g := range groups {
				for _, r := range muxed(a, nr, rule{action: act, conds: g}) {
					out[r.nr] = append(out[r.nr], r.rule)
				}
			}
		}
	}
	return out, last, nil
}

type numbered struct {
	nr int64
	rule
}

// muxed turns a rule on x86's multiplexed socket and ipc calls into
// libseccomp's two rules: one on socketcall(2) or ipc(2) whose first
// argument names the call (replacing any condition on it), one on the
// direct system call if x86 has it, with the original conditions.
func muxed(a arch, nr int64, r rule) []numbered {
	if nr >= 0 {
		if mux, ok := x86Direct[nr]; ok && a.oci == specs.ArchX86 {
			return []numbered{{nr, r}, {muxNr(mux), muxRule(mux, r)}}
		}
		return []numbered{{nr, r}}
	}
	out := []numbered{{muxNr(nr), muxRule(nr, r)}}
	for d, m := range x86Direct {
		if m == nr {
			out = append(out, numbered{d, r})
		}
	}
	return out
}

func muxNr(pseudo int64) int64 {
	if pseudo > -200 {
		return 102 // socketcall
	}
	return 117 // ipc
}

func muxRule(pseudo int64, r rule) rule {
	conds := []specs.LinuxSeccompArg{{Index: 0, Value: uint64(-pseudo % 100), Op: specs.OpEqualTo}}
	for _, c := range r.conds {
		if c.Index != 0 {
			conds = append(conds, c)
		}
	}
	return rule{action: r.action, conds: conds}
}

// x86Direct maps x86's direct socket and ipc system calls to libseccomp's
// pseudo numbers of their multiplexed forms (libseccomp's arch-x86.c).
var x86Direct = map[int64]int64{
	359: -101, 361: -102, 362: -103, 363: -104, 367: -106, 368: -107, 360: -108,
	369: -111, 371: -112, 373: -113, 366: -114, 365: -115, 370: -116, 372: -117,
	364: -118, 337: -119, 345: -120,
	393: -202, 394: -203, 395: -223, 396: -224, 397: -221, 398: -222,
	399: -213, 400: -211, 401: -212, 402: -214,
}
