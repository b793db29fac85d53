package e2e

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// execRes runs a shell command and returns its result whatever its exit.
func execRes(t *testing.T, c *client.Client, id, cmd string) *api.ExecResult {
	t.Helper()
	res, err := c.Exec(ctxT(t), id, &api.ExecRequest{Shell: cmd, TimeoutMs: 20000})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return res
}

// TestPhases switches a sandbox through setup → agent → eval mid-episode:
// each switch holds for every command started after it, without a
// restart, and a command keeps the phase it started in.
func TestPhases(t *testing.T) {
	out := testutil.NewOutside(t)
	s := startServer(t, out.ServerFlags()...)
	c := s.Client
	ctx := ctxT(t)
	shBefore, _ := os.ReadFile("/bin/sh")
	nb := newNeighbour(t, c)
	sb := netSandbox(t, c, api.CreateSandboxRequest{
		Phase: "setup",
		Phases: map[string]api.Phase{
			"setup": {Network: &api.Network{Mode: api.NetworkOpen}},
			"agent": {
				Network: &api.Network{Mode: api.NetworkAllowlist, Allow: []string{out.Web + ":8080"}},
				Files:   &api.FileRules{Deny: []string{"/eval"}, ReadOnly: []string{"/opt/task"}},
			},
			"eval": {Network: &api.Network{Mode: api.NetworkNone}},
		},
	})
	if sb.Phase != "setup" || len(sb.Phases) != 3 {
		t.Fatalf("created: phase %q, %d phases", sb.Phase, len(sb.Phases))
	}
	setPhase := func(t *testing.T, phase string) {
		t.Helper()
		got, err := c.SetPhase(ctx, sb.ID, phase)
		if err != nil {
			t.Fatalf("set phase %s: %v", phase, err)
		}
		if got.Phase != phase {
			t.Fatalf("phase after switch: %q", got.Phase)
		}
	}

	t.Run("setup: network open, everything writable", func(t *testing.T) {
		sh(t, c, sb.ID, "mkdir -p /eval /opt/task && echo 42 > /eval/answer && echo spec > /opt/task/README && ln -s /eval /sneaky")
		if ok, msg := fetch(t, c, sb.ID, out.Other+":8080"); !ok {
			t.Fatalf("setup phase cannot fetch: %s", msg)
		}
	})

	setPhase(t, "agent")
	t.Run("agent: /eval out of reach", func(t *testing.T) {
		for _, cmd := range []string{
			"cat /eval/answer", "cat /sneaky/answer", "echo 0 > /eval/answer", "rm -f /eval/answer",
			"touch /eval/conftest.py", "mv /eval /evil", "cp -r /eval /tmp/copy",
		} {
			if res := execRes(t, c, sb.ID, cmd); res.ExitCode == 0 {
				t.Errorf("%q succeeded in phase agent: %q", cmd, res.Stdout)
			}
		}
		// The trainer's own file API is not the agent: it still reads it.
		if b, err := c.ReadFile(ctx, sb.ID, "/eval/answer"); err != nil || string(b) != "42\n" {
			t.Fatalf("files API: %q %v", b, err)
		}
	})
	t.Run("agent: read-only task, the rest writable", func(t *testing.T) {
		if got := sh(t, c, sb.ID, "cat /opt/task/README; mkdir -p /tmp/w && echo ok > /tmp/w/f && cat /tmp/w/f"); got != "spec\nok\n" {
			t.Fatalf("got %q", got)
		}
		if res := execRes(t, c, sb.ID, "echo x >> /opt/task/README"); res.ExitCode == 0 {
			t.Fatal("wrote into a read-only path")
		}
	})
	t.Run("agent: only the allowlist answers", func(t *testing.T) {
		if ok, msg := fetch(t, c, sb.ID, out.Web+":8080"); !ok {
			t.Fatalf("allowlisted: %s", msg)
		}
		if ok, _ := fetch(t, c, sb.ID, out.Other+":8080"); ok {
			t.Fatal("fetched outside code from a non-allowlisted host in phase agent")
		}
	})
	t.Run("agent: commands cannot signal the agent", func(t *testing.T) {
		if res := execRes(t, c, sb.ID, "kill -TERM 1"); res.ExitCode == 0 {
			t.Fatal("a command signalled PID 1")
		}
		sh(t, c, sb.ID, "true") // the agent still serves
	})
	// A process started in phase agent, still running after the switch.
	if _, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Background: true,
		Shell: "sleep 1; cat /eval/answer > /tmp/late 2>/dev/null || echo denied > /tmp/late"}); err != nil {
		t.Fatal(err)
	}

	setPhase(t, "eval")
	t.Run("eval: everything readable, no network", func(t *testing.T) {
		if got := sh(t, c, sb.ID, "cat /eval/answer"); got != "42\n" {
			t.Fatalf("eval reads %q", got)
		}
		if ok, _ := fetch(t, c, sb.ID, out.Web+":8080"); ok {
			t.Fatal("phase eval reached the network")
		}
	})
	t.Run("a command keeps the phase it started in", func(t *testing.T) {
		testutil.Eventually(t, 10*time.Second, "the agent-phase process denied /eval", func() error {
			switch got := execRes(t, c, sb.ID, "cat /tmp/late").Stdout; got {
			case "denied\n":
				return nil
			case "":
				return errors.New("no answer yet")
			default:
				t.Fatalf("the agent-phase process read /eval after the switch: %q", got)
				return nil
			}
		})
	})

	t.Run("the neighbour and the host are unaffected", func(t *testing.T) {
		nb.check(t)
		hostOK(t, s, shBefore)
	})

	t.Run("bad phase switches", func(t *testing.T) {
		if _, err := c.SetPhase(ctx, sb.ID, "nope"); !client.IsInvalid(err) {
			t.Fatalf("unknown phase: %v", err)
		}
		plain := newSandbox(t, c, nil)
		if _, err := c.SetPhase(ctx, plain.ID, "agent"); !client.IsInvalid(err) {
			t.Fatalf("sandbox without phases: %v", err)
		}
	})

	t.Run("reset keeps the current phase", func(t *testing.T) {
		setPhase(t, "agent")
		if _, err := c.Reset(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		// A fresh writable layer: /eval is gone, and phase agent keeps it
		// from being made again (nothing new directly in an ancestor of a
		// restricted path).
		if res := execRes(t, c, sb.ID, "mkdir /eval || touch /eval/x"); res.ExitCode == 0 {
			t.Fatal("after reset phase agent no longer denies /eval")
		}
		if got := sh(t, c, sb.ID, "ls / | grep -c ."); got == "0\n" {
			t.Fatal("cannot list /")
		}
	})
}

// TestProfiles: a named profile stands for its phases, and the client lists
// the built-in profiles with those the server was started with.
func TestProfiles(t *testing.T) {
	file := filepath.Join(t.TempDir(), "profiles.json")
	if err := os.WriteFile(file, []byte(`{"grader": {"phase": "work", "phases": {
		"work": {"network": {"mode": "none"}, "files": {"deny": ["/grade"]}},
		"grade": {"network": {"mode": "none"}}}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "--profiles", file)
	c := s.Client
	t.Run("listed", func(t *testing.T) {
		ps, err := c.Profiles(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if swe := ps["swe"]; swe.Phase != "setup" || len(swe.Phases) != 3 {
			t.Errorf("built-in swe: %+v", swe)
		}
		g := ps["grader"]
		if g.Phase != "work" || len(g.Phases) != 2 || g.Phases["work"].Files == nil || g.Phases["work"].Files.Deny[0] != "/grade" {
			t.Errorf("server profile grader: %+v", g)
		}
		if len(ps) != 2 {
			t.Errorf("profiles %v, want swe and grader", slices.Collect(maps.Keys(ps)))
		}
	})
	t.Run("a listed profile creates", func(t *testing.T) {
		sb, err := c.CreateSandbox(ctxT(t), &api.CreateSandboxRequest{
			Layers: &api.LayerRefs{Base: "base:minimal"}, Profile: "grader", Resources: api.Resources{MemoryMB: 64},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.DeleteSandbox(ctxT(t), sb.ID)
		if sb.Phase != "work" || len(sb.Phases) != 2 {
			t.Fatalf("created from grader: phase %q, phases %v", sb.Phase, sb.Phases)
		}
		if got := execRes(t, c, sb.ID, "mkdir -p /grade/x 2>/dev/null && echo made"); got.ExitCode == 0 {
			t.Errorf("/grade is writable in phase work: %q", got.Stdout)
		}
	})
	sb, err := c.CreateSandbox(ctxT(t), &api.CreateSandboxRequest{
		Layers: &api.LayerRefs{Base: "base:minimal"}, Profile: "swe", Resources: api.Resources{MemoryMB: 128},
	})
	// swe opens the network in its setup phase: this node has none.
	if err == nil {
		c.DeleteSandbox(ctxT(t), sb.ID)
		t.Fatal("a profile that needs the network was created on a node without one")
	}
	for _, tc := range []struct {
		name string
		req  api.CreateSandboxRequest
	}{
		{"unknown profile", api.CreateSandboxRequest{Profile: "nope"}},
		{"profile and phases", api.CreateSandboxRequest{Profile: "swe", Phases: map[string]api.Phase{"a": {}}, Phase: "a"}},
		{"phases without a phase", api.CreateSandboxRequest{Phases: map[string]api.Phase{"a": {}}}},
		{"phase not among phases", api.CreateSandboxRequest{Phases: map[string]api.Phase{"a": {}}, Phase: "b"}},
		{"bad phase name", api.CreateSandboxRequest{Phases: map[string]api.Phase{"A B": {}}, Phase: "A B"}},
		{"relative file rule", api.CreateSandboxRequest{Phases: map[string]api.Phase{"a": {Files: &api.FileRules{Deny: []string{"eval"}}}}, Phase: "a"}},
		{"root file rule", api.CreateSandboxRequest{Phases: map[string]api.Phase{"a": {Files: &api.FileRules{Deny: []string{"/"}}}}, Phase: "a"}},
		{"bad allow entry", api.CreateSandboxRequest{Network: &api.Network{Mode: api.NetworkAllowlist, Allow: []string{"1.2.3.4:99999"}}}},
		{"IPv6 allow entry", api.CreateSandboxRequest{Network: &api.Network{Mode: api.NetworkAllowlist, Allow: []string{"[2001:db8::1]:443"}}}},
		{"allow without allowlist", api.CreateSandboxRequest{Network: &api.Network{Mode: api.NetworkOpen, Allow: []string{"1.2.3.4"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Layers = &api.LayerRefs{Base: "base:minimal"}
			_, err := c.CreateSandbox(ctxT(t), &tc.req)
			if !client.IsInvalid(err) {
				t.Fatalf("got %v, want invalid_argument", err)
			}
		})
	}
	testutil.RequireNoSandboxLeft(t, s)
}
