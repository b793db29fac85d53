package backendtest

import (
	"context"
	"testing"

	"github.com/dsec-project/dsec/internal/backend"
)

// recycle checks a backend.Recycler: a sandbox that a command left as it
// was is handed on without a reset; any change is reset away.
func recycle(t *testing.T, f Fixture, spec func(string) backend.Spec) {
	ctx := context.Background()
	b := f.New(t, t.TempDir())
	r, ok := b.(backend.Recycler)
	if !ok {
		t.Skipf("backend %s does not recycle (optional)", b.Name())
	}
	sp := spec(unique("recycle"))
	sp.Backend = b.Name()
	if err := b.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), sp.ID) })
	for _, tc := range []struct {
		name, cmd string
		reset     bool
	}{
		{"a fresh sandbox is clean", "", false},
		{"reading and printing change nothing", "echo hi; cat /etc/passwd >/dev/null; ls -la / /dev /dev/shm >/dev/null", false},
		{"a written file", "echo x > /tmp/written", true},
		{"clean again after the reset", "true", false},
		{"a file of a lower layer removed", "rm /bin/ls", true},
		{"a process left running", "sleep 300 &", true},
		{"a file in /dev/shm", "echo x > /dev/shm/f", true},
		{"a file made and removed in /dev/shm", "touch /dev/shm/g; rm /dev/shm/g", true},
		{"a symlink made in /dev", "ln -s /tmp /dev/tmplink", true},
		{"a read-only command after all that", "pwd", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cmd != "" {
				run(t, agentOf(b, sp.ID), tc.cmd)
			}
			reset, err := r.Recycle(ctx, sp.ID)
			if err != nil {
				t.Fatal(err)
			}
			if reset != tc.reset {
				t.Fatalf("Recycle after %q reset=%v, want %v", tc.cmd, reset, tc.reset)
			}
			out := run(t, agentOf(b, sp.ID), "ls /tmp/written /dev/shm/f 2>/dev/null; test -e /bin/ls && echo ls; "+
				"stat -c %a /dev/zero; ps -o comm= | grep -c '^sleep$' || true")
			if out != "ls\n666\n0\n" {
				t.Fatalf("after Recycle the sandbox is not clean: %q", out)
			}
		})
	}
}
