package e2e

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestMicroVMForkAndHibernate forks a microVM running a counter through
// the API: every copy continues the parent's counter process from the
// fork point (its memory came along), under its own host name and machine
// id, and the parent goes on. Then the parent hibernates (memory to disk),
// stays hibernated across a server restart, and resumes with its counter
// going on. Bad requests get clear 4xx; nothing is left behind.
func TestMicroVMForkAndHibernate(t *testing.T) {
	testutil.Require(t, testutil.MicroVMRequirements...)
	s := startServer(t, "--microvm", "on")
	c := s.Client
	ctx := ctxT(t)
	parent, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{
		Backend: api.BackendMicroVM, Layers: &api.LayerRefs{Base: "base:minimal"},
		Resources: api.Resources{CPU: 1, MemoryMB: 256, DiskMB: 512},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), parent.ID) })
	if _, err := c.Exec(ctx, parent.ID, &api.ExecRequest{Background: true,
		Shell: `i=0; while :; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.1; done`}); err != nil {
		t.Fatal(err)
	}
	count := func(c *client.Client, id string) int {
		t.Helper()
		n, _ := strconv.Atoi(strings.TrimSpace(sh(t, c, id, "cat /tmp/n 2>/dev/null || echo 0")))
		return n
	}
	countsOn := func(c *client.Client, id string, from int) int {
		t.Helper()
		var n int
		testutil.Eventually(t, time.Minute, fmt.Sprintf("the counter of %s past %d", id, from), func() error {
			if n = count(c, id); n <= from {
				return fmt.Errorf("the counter stays at %d", n)
			}
			return nil
		})
		return n
	}
	before := countsOn(c, parent.ID, 0)
	parentIdent := sh(t, c, parent.ID, "hostname; cat /etc/machine-id 2>/dev/null || true")

	t.Run("bad input", func(t *testing.T) {
		other, _ := tenantClient(t, s, "vmforker")
		box := newSandbox(t, c, nil)
		for _, tc := range []struct {
			name string
			do   func() error
			code string
		}{
			{"zero copies", func() error { _, err := c.Fork(ctx, parent.ID, &api.ForkRequest{Count: 0}); return err }, api.CodeInvalid},
			{"10,000 copies", func() error { _, err := c.Fork(ctx, parent.ID, &api.ForkRequest{Count: 10000}); return err }, api.CodeInvalid},
			{"another tenant's microVM", func() error { _, err := other.Fork(ctx, parent.ID, &api.ForkRequest{Count: 1}); return err }, api.CodeNotFound},
			{"hibernate another tenant's microVM", func() error { _, err := other.Hibernate(ctx, parent.ID); return err }, api.CodeNotFound},
			{"hibernate a container", func() error { _, err := c.Hibernate(ctx, box.ID); return err }, api.CodeInvalid},
		} {
			err := tc.do()
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != tc.code {
				t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
			}
		}
		if got, err := c.GetSandbox(ctx, box.ID); err != nil || got.State != api.StateRunning {
			t.Errorf("the container after a refused hibernate: %+v %v", got, err)
		}
	})

	const k = 2
	res, err := c.Fork(ctx, parent.ID, &api.ForkRequest{Count: k, Labels: map[string]string{"run": "vm"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range res.Sandboxes {
		t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	}
	if len(res.Sandboxes) != k || !res.Memory || res.Layer != "" {
		t.Fatalf("fork result %+v", res)
	}
	idents := map[string]bool{parentIdent: true}
	for _, sb := range res.Sandboxes {
		if sb.State != api.StateRunning || sb.Backend != api.BackendMicroVM || sb.Node != parent.Node ||
			sb.Labels[api.LabelForkOf] != parent.ID || sb.Labels["run"] != "vm" {
			t.Fatalf("copy %+v", sb)
		}
		n := count(c, sb.ID)
		if n < before {
			t.Fatalf("copy %s: counter %d, below %d before the fork", sb.ID, n, before)
		}
		countsOn(c, sb.ID, n)
		ident := sh(t, c, sb.ID, "hostname; cat /etc/machine-id")
		if idents[ident] || !strings.HasPrefix(ident, sb.ID+"\n") {
			t.Fatalf("copy %s: identity %q (seen: %v)", sb.ID, ident, idents)
		}
		idents[ident] = true
	}
	countsOn(c, parent.ID, count(c, parent.ID))
	for _, sb := range res.Sandboxes {
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}

	// Hibernate: the memory goes to disk; the sandbox stays paused across
	// a server restart and resumes with its processes.
	got, err := c.Hibernate(ctx, parent.ID)
	if err != nil || got.State != api.StatePaused {
		t.Fatalf("hibernate: %+v %v", got, err)
	}
	s.Kill()
	s.Restart()
	c = s.Client
	if got, err := c.GetSandbox(ctx, parent.ID); err != nil || got.State != api.StatePaused {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if _, err := c.Resume(ctx, parent.ID); err != nil {
		t.Fatal(err)
	}
	countsOn(c, parent.ID, count(c, parent.ID))
	if err := c.DeleteSandbox(ctx, parent.ID); err != nil {
		t.Fatal(err)
	}
	testutil.RequireNoSandboxLeft(t, s)
}
