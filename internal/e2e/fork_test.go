package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestFork forks a container mid-trajectory: every copy sees the parent's
// files as they were at the fork, none sees another's (or the parent's)
// later writes, each copy's trajectory replays the shared prefix and runs
// what follows, a fork of a fork carries the copy's own changes, and
// failed forks leave no sandbox, layer or trajectory behind.
func TestFork(t *testing.T) {
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)

	parent := newSandbox(t, c, nil)
	for i, cmd := range []string{"mkdir -p /w && echo one > /w/a", "echo two >> /w/a && rm -f /etc/motd", "head -c 100000 /dev/urandom > /w/big && md5sum /w/big > /w/big.md5"} {
		res := execStep(t, c, parent.ID, stepReq("branchy", int64(i+1), cmd))
		if res.ExitCode != 0 || res.Replayed {
			t.Fatalf("step %d: %+v", i+1, res)
		}
	}
	// A process running in the parent is not carried (containers fork
	// their filesystem only).
	if _, err := c.Exec(ctx, parent.ID, &api.ExecRequest{Shell: "sleep 600", Background: true}); err != nil {
		t.Fatal(err)
	}

	const k = 3
	res, err := c.Fork(ctx, parent.ID, &api.ForkRequest{Count: k, Labels: map[string]string{"run": "f1"},
		Trajectory: &api.ForkTrajectoryRequest{ID: "branchy"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sandboxes) != k || len(res.Trajectories) != k || !strings.HasPrefix(res.Layer, "fork/"+parent.ID+":") {
		t.Fatalf("fork result %+v", res)
	}
	for _, sb := range res.Sandboxes {
		t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	}
	// The parent goes on, and its later writes are its own.
	sh(t, c, parent.ID, "echo parent-after > /w/after")

	want := "one\ntwo\n"
	for i, sb := range res.Sandboxes {
		if sb.State != api.StateRunning || sb.Labels[api.LabelForkOf] != parent.ID || sb.Labels["run"] != "f1" ||
			sb.Labels[api.LabelFork] != res.Fork {
			t.Fatalf("copy %d: %+v", i, sb)
		}
		if got := sh(t, c, sb.ID, "cat /w/a; test ! -e /etc/motd && echo gone; md5sum -c /w/big.md5 >/dev/null && echo ok"); got != want+"gone\nok\n" {
			t.Fatalf("copy %d sees %q", i, got)
		}
		if got := sh(t, c, sb.ID, "ps -o comm | grep -c '^sleep' || true"); strings.TrimSpace(got) != "0" {
			t.Fatalf("copy %d runs the parent's processes: %q", i, got)
		}
		sh(t, c, sb.ID, fmt.Sprintf("echo %d > /w/mine", i))
	}
	for i, sb := range res.Sandboxes {
		got := sh(t, c, sb.ID, "cat /w/mine; ls /w")
		if !strings.HasPrefix(got, fmt.Sprintf("%d\n", i)) || strings.Contains(got, "after") {
			t.Fatalf("copy %d sees %q: another's writes", i, got)
		}
	}
	if got := sh(t, c, parent.ID, "ls /w"); strings.Contains(got, "mine") {
		t.Fatalf("the parent sees a copy's write: %q", got)
	}

	// Each branch replays the prefix from the log and runs on from there.
	for i, tr := range res.Trajectories {
		if tr.ForkFrom != "branchy" || tr.Sandbox != res.Sandboxes[i].ID || tr.Steps != 3 {
			t.Fatalf("trajectory %d: %+v", i, tr)
		}
		r := execStep(t, c, tr.Sandbox, stepReq(tr.ID, 2, "echo two >> /w/a && rm -f /etc/motd"))
		if !r.Replayed {
			t.Fatalf("branch %s step 2 ran again: %+v", tr.ID, r)
		}
		r = execStep(t, c, tr.Sandbox, stepReq(tr.ID, 4, "cat /w/a"))
		if r.Replayed || r.Stdout != want {
			t.Fatalf("branch %s step 4: %+v", tr.ID, r)
		}
	}

	// A fork of a fork carries the copy's own changes.
	sub, err := c.Fork(ctx, res.Sandboxes[1].ID, &api.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sub.Sandboxes[0].ID) })
	if got := sh(t, c, sub.Sandboxes[0].ID, "cat /w/mine /w/a"); got != "1\n"+want {
		t.Fatalf("fork of a fork sees %q", got)
	}

	t.Run("bad requests", func(t *testing.T) {
		other, _ := tenantClient(t, s, "forker")
		tests := []struct {
			name string
			c    *client.Client
			id   string
			req  api.ForkRequest
			code string
		}{
			{"zero copies", c, parent.ID, api.ForkRequest{Count: 0}, api.CodeInvalid},
			{"too many copies", c, parent.ID, api.ForkRequest{Count: 10000}, api.CodeInvalid},
			{"server label", c, parent.ID, api.ForkRequest{Count: 1, Labels: map[string]string{api.LabelForkOf: "x"}}, api.CodeInvalid},
			{"another tenant's sandbox", other, parent.ID, api.ForkRequest{Count: 1}, api.CodeNotFound},
			{"missing sandbox", c, "sb-nonexistent", api.ForkRequest{Count: 1}, api.CodeNotFound},
			{"unknown trajectory", c, parent.ID, api.ForkRequest{Count: 1, Trajectory: &api.ForkTrajectoryRequest{ID: "nope"}}, api.CodeNotFound},
			{"ids for the wrong count", c, parent.ID, api.ForkRequest{Count: 2, Trajectory: &api.ForkTrajectoryRequest{ID: "branchy", IDs: []string{"x"}}}, api.CodeInvalid},
			{"branch exists", c, parent.ID, api.ForkRequest{Count: 1, Trajectory: &api.ForkTrajectoryRequest{ID: "branchy", IDs: []string{res.Trajectories[0].ID}}}, api.CodeAlreadyExists},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				if _, err := tc.c.Fork(ctx, tc.id, &tc.req); client.Code(err) != tc.code {
					t.Fatalf("fork = %v, want %s", err, tc.code)
				}
			})
		}
	})

	t.Run("failed fork leaves nothing", func(t *testing.T) {
		oc, tenant := tenantClient(t, s, "forkquota")
		p := newSandbox(t, oc, nil)
		sh(t, oc, p.ID, "echo x > /x")
		if _, err := s.Client.SetQuota(ctx, tenant, api.Quota{Sandboxes: 3}); err != nil {
			t.Fatal(err)
		}
		_, err := oc.Fork(ctx, p.ID, &api.ForkRequest{Count: 4})
		if code := client.Code(err); code != api.CodeResourceExhausted {
			t.Fatalf("fork over the quota = %v", err)
		}
		if live := liveWithLabel(t, oc, api.LabelForkOf, p.ID); len(live) != 0 {
			t.Fatalf("a failed fork left %d copies", len(live))
		}
		layers, err := oc.ListLayers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layers {
			if strings.HasPrefix(l.Name, "fork/") {
				t.Fatalf("a failed fork left its layer %s:%s", l.Name, l.Tag)
			}
		}
		if got := sh(t, oc, p.ID, "cat /x"); got != "x\n" {
			t.Fatalf("parent after a failed fork: %q", got)
		}
	})

	for _, sb := range append(res.Sandboxes, sub.Sandboxes...) {
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	c.DeleteSandbox(ctx, parent.ID)
	deleteAll(t, c)
	testutil.RequireNoSandboxLeft(t, s)
}
