package seccomp_test

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/seccomp"
)

// TestDecisions checks known verdicts of the commands' profile, without
// runc: what the equivalence test relies on is also what we mean.
func TestDecisions(t *testing.T) {
	prof, err := seccomp.Docker(dockerCaps)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := seccomp.Compile(prof)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := prog.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	back, err := seccomp.Unmarshal(raw)
	if err != nil || len(back) != len(prog) {
		t.Fatalf("round trip: %d instructions, %v", len(back), err)
	}
	v := newVM(t, back)
	const (
		allow = "ALLOW"
		eperm = "ERRNO(1)"
		enos  = "ERRNO(38)"
	)
	x64, x86 := uint32(unix.AUDIT_ARCH_X86_64), uint32(unix.AUDIT_ARCH_I386)
	for _, tc := range []struct {
		name     string
		arch, nr uint32
		arg0     uint64
		want     string
	}{
		{"read", x64, unix.SYS_READ, 0, allow},
		{"read as x32", x64, 1<<30 | unix.SYS_READ, 0, allow},
		{"read on x86", x86, 3, 0, allow},
		{"clone of a thread", x64, unix.SYS_CLONE, unix.CLONE_VM | unix.CLONE_THREAD, allow},
		{"clone into a new user namespace", x64, unix.SYS_CLONE, unix.CLONE_NEWUSER, eperm},
		{"clone3 answers ENOSYS so libc falls back", x64, unix.SYS_CLONE3, 0, enos},
		{"unshare", x64, unix.SYS_UNSHARE, 0, eperm},
		{"mount", x64, unix.SYS_MOUNT, 0, eperm},
		{"pivot_root", x64, unix.SYS_PIVOT_ROOT, 0, eperm},
		{"socket AF_INET", x64, unix.SYS_SOCKET, unix.AF_INET, allow},
		{"socket AF_VSOCK", x64, unix.SYS_SOCKET, unix.AF_VSOCK, eperm},
		{"socket AF_INET with the high word set", x64, unix.SYS_SOCKET, 1<<32 | unix.AF_INET, eperm},
		{"personality(PER_LINUX)", x64, unix.SYS_PERSONALITY, 0, allow},
		{"personality(other)", x64, unix.SYS_PERSONALITY, 1, eperm},
		{"keyctl", x64, unix.SYS_KEYCTL, 0, eperm},
		{"a system call newer than the profile", x64, 1000, 0, enos},
		{"a foreign architecture is killed", unix.AUDIT_ARCH_AARCH64, 0, 0, "KILL_THREAD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := verdict(v.decide(tc.arch, tc.nr, [6]uint64{tc.arg0})); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// TestComparisonSeesDifferences guards the equivalence test: a profile
// that differs in one argument rule must differ in some decision.
func TestComparisonSeesDifferences(t *testing.T) {
	prof, err := seccomp.Docker(dockerCaps)
	if err != nil {
		t.Fatal(err)
	}
	a, err := seccomp.Compile(prof)
	if err != nil {
		t.Fatal(err)
	}
	for i, sc := range prof.Syscalls {
		if len(sc.Names) == 1 && sc.Names[0] == "personality" {
			prof.Syscalls[i].Args = []specs.LinuxSeccompArg{{Index: 0, Value: 9, Op: specs.OpEqualTo}}
			break
		}
	}
	b, err := seccomp.Compile(prof)
	if err != nil {
		t.Fatal(err)
	}
	va, vb := newVM(t, a), newVM(t, b)
	differ := false
	vectors := argVectors()
	inputs(func(arch, nr uint32) {
		for _, args := range vectors {
			differ = differ || va.decide(arch, nr, args) != vb.decide(arch, nr, args)
		}
	})
	if !differ {
		t.Fatal("the comparison found no difference between different profiles")
	}
}
