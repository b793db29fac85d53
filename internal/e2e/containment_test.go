package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// offenderResources are small on purpose: every bomb hits its limit fast.
var offenderResources = api.Resources{CPU: 0.5, MemoryMB: 96, DiskMB: 64, Pids: 64}

// neighbour is a sandbox that keeps a heartbeat while others misbehave.
type neighbour struct {
	c  *client.Client
	id string
}

func newNeighbour(t *testing.T, c *client.Client) *neighbour {
	t.Helper()
	sb := newSandbox(t, c, nil)
	sh(t, c, sb.ID, "echo secret-of-the-neighbour > /tmp/neighbour-secret")
	if _, err := c.Exec(ctxT(t), sb.ID, &api.ExecRequest{Background: true,
		Shell: "i=0; while true; do i=$((i+1)); echo $i > /tmp/hb.new; mv /tmp/hb.new /tmp/hb; sleep 0.1; done"}); err != nil {
		t.Fatal(err)
	}
	return &neighbour{c: c, id: sb.ID}
}

// check asserts the neighbour still beats, answers promptly and kept its
// files.
func (n *neighbour) check(t *testing.T) {
	t.Helper()
	read := func() int {
		v, _ := strconv.Atoi(strings.TrimSpace(sh(t, n.c, n.id, "cat /tmp/hb")))
		return v
	}
	// The beat is written to a new file and renamed, so a read never sees
	// it half-written.
	a := read()
	testutil.Eventually(t, 30*time.Second, "the neighbour's heartbeat going on", func() error {
		if b := read(); b <= a {
			return fmt.Errorf("%d then %d", a, b)
		}
		return nil
	})
	if got := sh(t, n.c, n.id, "cat /tmp/neighbour-secret"); got != "secret-of-the-neighbour\n" {
		t.Fatalf("neighbour's files changed: %q", got)
	}
}

// hostOK asserts the control plane is healthy and the host's /bin/sh
// untouched.
func hostOK(t *testing.T, s *testutil.Server, shBefore []byte) {
	t.Helper()
	resp, err := http.Get(s.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("control plane unhealthy: %v", err)
	}
	resp.Body.Close()
	if after, _ := os.ReadFile("/bin/sh"); string(after) != string(shBefore) {
		t.Fatal("the host's /bin/sh changed")
	}
}

// recovers asserts the offender can still be reset and then works.
func recovers(t *testing.T, c *client.Client, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Reset(ctx, id); err != nil {
		t.Fatalf("reset the offender: %v", err)
	}
	if got := sh(t, c, id, "echo alive; ls /tmp | wc -l"); got != "alive\n0\n" {
		t.Fatalf("offender after reset: %q", got)
	}
}

// TestContainment runs what misbehaving agents did in production, each in
// its own sandbox next to a neighbour with a heartbeat; after each the host
// and the neighbour are fine and the offender resets cleanly.
func TestContainment(t *testing.T) {
	s := startServer(t)
	c := s.Client
	shBefore, _ := os.ReadFile("/bin/sh")
	nb := newNeighbour(t, c)
	edgeDir := filepath.Join(s.DataDir, "edge", "container", "sandboxes")

	attacks := []struct {
		name string
		run  func(t *testing.T, id string)
	}{
		{"read the host's logs and another sandbox's files", func(t *testing.T, id string) {
			script := `for p in /var/log/syslog /var/log/messages /etc/shadow "` + s.DataDir + `/server.log" "` + s.DataDir + `/admin.key" "` + edgeDir + `"; do
				cat "$p" 2>/dev/null && echo "READ $p"; done
				grep -rs secret-of-the-neighbour / --exclude-dir=proc --exclude-dir=sys && echo FOUND
				ls /proc | grep -c '^[0-9]'`
			res := execRes(t, c, id, script)
			if strings.Contains(res.Stdout, "READ ") || strings.Contains(res.Stdout, "FOUND") {
				t.Fatalf("read what it must not:\n%s", res.Stdout)
			}
			// Its own PID namespace: a handful of its own processes only.
			if n, _ := strconv.Atoi(strings.TrimSpace(lastLine(res.Stdout))); n == 0 || n > 20 {
				t.Fatalf("sees %d processes", n)
			}
		}},
		{"forge requests to the control plane, the edge and agents", func(t *testing.T, id string) {
			port := s.URL[strings.LastIndexByte(s.URL, ':')+1:]
			script := fmt.Sprintf(`nc -w 1 127.0.0.1 %s </dev/null && echo CONTROL
				ls %s/edge.sock 2>/dev/null && echo EDGE
				find / -xdev -type s 2>/dev/null | grep . && echo SOCKETS
				ls -l /proc/1/fd/ 2>/dev/null | grep -q socket && echo AGENTFD
				cat /proc/1/environ 2>/dev/null | grep -q . && echo AGENTENV
				ls /sys/class/net`, port, s.DataDir)
			res := execRes(t, c, id, script)
			for _, bad := range []string{"CONTROL", "EDGE", "SOCKETS", "AGENTFD", "AGENTENV"} {
				if strings.Contains(res.Stdout, bad) {
					t.Fatalf("%s reachable:\n%s", bad, res.Stdout)
				}
			}
			if strings.TrimSpace(res.Stdout) != "lo" {
				t.Fatalf("interfaces: %q", res.Stdout)
			}
		}},
		{"overwrite /bin/sh", func(t *testing.T, id string) {
			sh(t, c, id, `rm -f /bin/sh && printf '#!/bin/busybox ash\necho pwned\n' > /bin/sh && chmod 755 /bin/sh`)
			if got := sh(t, c, id, "echo hi"); got != "pwned\n" {
				t.Fatalf("the offender's own /bin/sh: %q", got)
			}
			if got := sh(t, c, nb.id, "echo hi"); got != "hi\n" {
				t.Fatalf("the neighbour's /bin/sh: %q", got)
			}
		}},
		{"recursively read all of /proc and /sys", func(t *testing.T, id string) {
			// Some files block (trace pipes): each read gets a second; the
			// scan as a whole gets 15. What matters is what survives it.
			res, err := c.Exec(ctxT(t), id, &api.ExecRequest{TimeoutMs: 15000,
				Shell: `find /proc /sys -type f 2>/dev/null | xargs -n 100 timeout 1 cat >/dev/null 2>&1; echo done`})
			if err != nil {
				t.Fatalf("the scan broke the agent: %v", err)
			}
			t.Logf("scan: timed out %v, %d ms", res.TimedOut, res.DurationMs)
			key, _ := os.ReadFile(filepath.Join(s.DataDir, "admin.key"))
			// The pattern goes in a file, or grep would find its own argv.
			if err := c.WriteFile(ctxT(t), id, "/tmp/pattern", strings.NewReader(strings.TrimSpace(string(key))), 0o600); err != nil {
				t.Fatal(err)
			}
			res = execRes(t, c, id, "grep -slFf /tmp/pattern /proc/[0-9]*/environ /proc/[0-9]*/cmdline /proc/self/mountinfo; rm /tmp/pattern; cat /proc/kcore /proc/keys /proc/timer_list /proc/sched_debug 2>/dev/null | wc -c")
			if strings.Contains(res.Stdout, "/") || strings.TrimSpace(res.Stdout) != "0" {
				t.Fatalf("host secrets or masked files readable: %q", res.Stdout)
			}
		}},
		{"yes > /tmp/x fills only its own disk", func(t *testing.T, id string) {
			res := execRes(t, c, id, "timeout 10 yes > /tmp/x; echo rc=$?; df -m /tmp | tail -1")
			if !strings.Contains(res.Stderr+res.Stdout, "No space left") && !strings.Contains(res.Stdout, "rc=1") {
				t.Fatalf("yes > /tmp/x did not hit the disk limit: %+v", res)
			}
			assertDiskBounded(t, filepath.Join(edgeDir, id, "disk.img"), offenderResources.DiskMB)
		}},
		{"yes to stdout", func(t *testing.T, id string) {
			res, err := c.Exec(ctxT(t), id, &api.ExecRequest{Shell: "yes", TimeoutMs: 3000, MaxOutputBytes: 1 << 16})
			if err != nil {
				t.Fatal(err)
			}
			if !res.TimedOut || !res.Truncated || len(res.Stdout) > 1<<17 || res.StdoutDropped < 1<<20 {
				t.Fatalf("yes: timed out %v, truncated %v, kept %d, dropped %d", res.TimedOut, res.Truncated, len(res.Stdout), res.StdoutDropped)
			}
			if st, err := os.Stat(filepath.Join(edgeDir, id, "agent.log")); err != nil || st.Size() > 2<<20 {
				t.Fatalf("agent log: %v %v", st.Size(), err)
			}
		}},
		{"fork bomb", func(t *testing.T, id string) {
			res := execRes(t, c, id, `bomb() { bomb | bomb & }; bomb; sleep 3; echo survived`)
			_ = res // the shell may or may not survive its own bomb
			if got := sh(t, c, nb.id, "echo ok"); got != "ok\n" {
				t.Fatalf("neighbour: %q", got)
			}
		}},
		{"memory bomb", func(t *testing.T, id string) {
			res := execRes(t, c, id, "dd if=/dev/zero of=/dev/null bs=400M count=1 2>/dev/null; echo rc=$?")
			if !strings.Contains(res.Stdout, "rc=137") && res.ExitCode != 137 {
				t.Fatalf("memory bomb was not OOM-killed inside: %+v", res)
			}
			if got := sh(t, c, id, "echo agent-alive"); got != "agent-alive\n" {
				t.Fatalf("the agent died with the bomb: %q", got)
			}
		}},
		{"fill the disk", func(t *testing.T, id string) {
			res := execRes(t, c, id, "dd if=/dev/zero of=/tmp/fill bs=1M count=1000 2>&1; df -m / | tail -1")
			if !strings.Contains(res.Stdout, "No space left") {
				t.Fatalf("dd did not hit ENOSPC: %+v", res)
			}
			assertDiskBounded(t, filepath.Join(edgeDir, id, "disk.img"), offenderResources.DiskMB)
			sh(t, c, id, "rm /tmp/fill && echo freed > /tmp/after")
		}},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			sb, err := c.CreateSandbox(ctxT(t), &api.CreateSandboxRequest{
				Layers: &api.LayerRefs{Base: "base:minimal"}, Resources: offenderResources,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer c.DeleteSandbox(context.Background(), sb.ID)
			a.run(t, sb.ID)
			nb.check(t)
			hostOK(t, s, shBefore)
			recovers(t, c, sb.ID)
			if err := c.DeleteSandbox(ctxT(t), sb.ID); err != nil {
				t.Fatalf("destroy the offender: %v", err)
			}
		})
	}
	nb.check(t)
	c.DeleteSandbox(ctxT(t), nb.id)
	testutil.RequireNoSandboxLeft(t, s)
}

// assertDiskBounded checks the node holds no more of a sandbox's writes
// than its disk limit.
func assertDiskBounded(t *testing.T, image string, limitMB int64) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(image, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > (limitMB+8)<<20 {
		t.Fatalf("the sandbox's disk image holds %d MiB on the node, limit %d MiB", used>>20, limitMB)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
