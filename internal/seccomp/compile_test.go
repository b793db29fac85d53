package seccomp_test

import (
	"encoding/binary"
	"fmt"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/seccomp"
	"github.com/dsec-project/dsec/internal/testutil"
)

// dockerCaps is Docker's default capability set without CAP_NET_RAW, as
// the container backend gives commands.
var dockerCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// vm runs a seccomp filter on struct seccomp_data values.
type vm struct{ *bpf.VM }

func newVM(t *testing.T, raw []bpf.RawInstruction) vm {
	t.Helper()
	ins, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("program does not disassemble")
	}
	v, err := bpf.NewVM(ins)
	if err != nil {
		t.Fatal(err)
	}
	return vm{v}
}

// decide returns the filter's verdict. x/net/bpf loads words big-endian;
// seccomp_data is native (little) endian, so each 32-bit word is laid out
// big-endian at its little-endian place and the VM reads the right value.
func (v vm) decide(arch, nr uint32, args [6]uint64) uint32 {
	var in [64]byte
	binary.BigEndian.PutUint32(in[0:], nr)
	binary.BigEndian.PutUint32(in[4:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(in[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(in[20+8*i:], uint32(a>>32))
	}
	r, err := v.Run(in[:])
	if err != nil {
		panic(err)
	}
	return uint32(r)
}

// argValues are the argument values tried with every system call: the
// datums and masks of Docker's profile, their neighbours, and values whose
// high word is set (which 32-bit architectures must ignore).
var argValues = []uint64{
	0, 1, 2, 3, 4, 7, 8, 9, 10, 16, 17, 38, 39, 40, 41, 45, 46,
	0x20000, 0x20008, 0x7E020000, 0x10000000, 0x00000100, 0x00020000, 0x80000000,
	0xffffffff, 0xfffffffe, 1 << 32, 1<<32 | 3, 1<<32 | 8, 0xffffffff_ffffffff, 0x7fffffff_00000000,
}

// argVectors puts each value in the first argument, then in all six.
func argVectors() [][6]uint64 {
	var out [][6]uint64
	for _, v := range argValues {
		out = append(out, [6]uint64{v}, [6]uint64{v, v, v, v, v, v})
	}
	return out
}

// inputs calls fn with every (arch, nr) tried: every number up to 1023
// natively and as x32, numbers around the x32 bit and the top, on x86_64,
// x86, a foreign architecture and a bogus one.
func inputs(fn func(arch, nr uint32)) {
	edges := []uint32{0x3fffffff, 0x7fffffff, 0x80000000, 0x80000001, 0xbfffffff, 0xc0000000, 0xc0000001, 0xfffffffe, 0xffffffff}
	for _, arch := range []uint32{unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_AARCH64, 0} {
		n := uint32(1024)
		if arch != unix.AUDIT_ARCH_X86_64 && arch != unix.AUDIT_ARCH_I386 {
			n = 8
		}
		for nr := range n {
			fn(arch, nr)
			if arch == unix.AUDIT_ARCH_X86_64 {
				fn(arch, nr|1<<30)
			}
		}
		for _, nr := range edges {
			fn(arch, nr)
		}
	}
}

// profiles are the two the container backend compiles: commands get
// Docker's profile for their capabilities; the agent, which keeps
// CAP_SYS_ADMIN, Docker's profile for that set plus pivot_root.
func profiles(t *testing.T) map[string]struct {
	caps []string
	prof *specs.LinuxSeccomp
} {
	cmd, err := seccomp.Docker(dockerCaps)
	if err != nil {
		t.Fatal(err)
	}
	agentCaps := append(append([]string{}, dockerCaps...), "CAP_SYS_ADMIN")
	agent, err := seccomp.Docker(agentCaps)
	if err != nil {
		t.Fatal(err)
	}
	agent.Syscalls = append(agent.Syscalls, specs.LinuxSyscall{Names: []string{"pivot_root"}, Action: specs.ActAllow})
	return map[string]struct {
		caps []string
		prof *specs.LinuxSeccomp
	}{"commands": {dockerCaps, cmd}, "agent": {agentCaps, agent}}
}

func TestSameDecisionsAsRunc(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"))
	for name, p := range profiles(t) {
		t.Run(name, func(t *testing.T) {
			ours, err := seccomp.Compile(p.prof)
			if err != nil {
				t.Fatal(err)
			}
			theirs := runcFilter(t, p.prof, p.caps)
			t.Logf("runc's program: %d instructions; ours: %d", len(theirs), len(ours))
			a, b := newVM(t, ours), newVM(t, theirs)
			vectors := argVectors()
			diffs, runs := 0, 0
			inputs(func(arch, nr uint32) {
				for _, args := range vectors {
					runs++
					if x, y := a.decide(arch, nr, args), b.decide(arch, nr, args); x != y {
						if diffs++; diffs <= 20 {
							t.Errorf("arch %#x nr %d (%#x) args %#x: ours %s, runc's %s", arch, nr, nr, args[:2], verdict(x), verdict(y))
						}
					}
				}
			})
			if diffs > 0 {
				t.Fatalf("%d of %d decisions differ", diffs, runs)
			}
			t.Logf("%d decisions agree", runs)
		})
	}
}

func verdict(r uint32) string {
	switch r & 0xffff0000 {
	case 0x7fff0000:
		return "ALLOW"
	case 0x00050000:
		return fmt.Sprintf("ERRNO(%d)", r&0xffff)
	case 0:
		return "KILL_THREAD"
	case 0x80000000:
		return "KILL_PROCESS"
	}
	return fmt.Sprintf("%#x", r)
}
