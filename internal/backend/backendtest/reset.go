package backendtest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
)

// dirty leaves a mark everywhere a command can: files in the writable
// layer, /tmp, /dev, /dev/shm and the POSIX queue file system, a changed
// file of a lower layer, background processes (one ignoring SIGTERM, one
// in its own session), and a background process record in the agent.
const dirty = `echo x > /dirty; echo y > /tmp/dirty; rm /bin/ls; ln -s /tmp /dev/tmplink;
echo z > /dev/shm/dirty; (touch /dev/mqueue/q 2>/dev/null || true);
(trap '' TERM; sleep 1000) & setsid sleep 1000 & sleep 1000 &
echo ok`

// probe prints what must be the same in a fresh sandbox and after every
// reset. A virtual console's mode (/dev/ttyN) is left out: in a full VM
// getty and login change it at their own pace after every boot.
const probe = `ls -a / | tr '\n' ' '; echo; ls -la /dev | awk '{ if ($NF ~ /^tty[0-9]+$/) print $NF; else print $1, $NF }' | tr '\n' ' '; echo;
ls -a /tmp /dev/shm /dev/mqueue | tr '\n' ' '; echo; test -e /bin/ls && echo ls;
ps -o comm= | grep -c sleep || true; cat /proc/self/status | grep -E '^(Seccomp|CapBnd|NoNewPrivs)'`

// resetClean resets a dirtied sandbox three times and compares it each
// time with a fresh one: same files, same /dev, no process, no agent
// record of a background process; the phase's file rules still apply.
func resetClean(t *testing.T, f Fixture, spec func(string) backend.Spec) {
	ctx := context.Background()
	b := f.New(t, t.TempDir())
	sp := spec(unique("reset"))
	sp.Backend = b.Name()
	sp.Phase = "agent"
	sp.Files = api.FileRules{Deny: []string{"/secret"}}
	if err := b.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), sp.ID) })
	fresh := run(t, agentOf(b, sp.ID), probe)
	n := 3
	if f.Lean {
		n = 1
	}
	for i := 1; i <= n; i++ {
		t.Run(fmt.Sprintf("reset %d", i), func(t *testing.T) {
			ag := agentOf(b, sp.ID)
			if out := run(t, ag, dirty); !strings.HasSuffix(out, "ok\n") {
				t.Fatalf("dirty: %q", out)
			}
			if _, err := ag.Exec(ctx, &api.ExecRequest{Shell: "sleep 1000", Background: true}); err != nil {
				t.Fatal(err)
			}
			if err := b.Reset(ctx, sp.ID); err != nil {
				t.Fatal(err)
			}
			ag = agentOf(b, sp.ID)
			if got := run(t, ag, probe); got != fresh {
				t.Fatalf("after reset:\n%s\nfresh:\n%s", got, fresh)
			}
			procs, err := ag.Processes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(procs) != 0 {
				t.Fatalf("the agent still lists %d background processes", len(procs))
			}
			res, err := ag.Exec(ctx, &api.ExecRequest{Shell: "mkdir /secret"})
			if err != nil || res.ExitCode == 0 {
				t.Fatalf("the phase's file rules no longer apply: %+v %v", res, err)
			}
		})
	}
}
