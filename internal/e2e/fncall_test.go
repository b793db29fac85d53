package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

var minimal = &api.LayerRefs{Base: "base:minimal"}

func call(t *testing.T, c *client.Client, req api.FnCallRequest) *api.ExecResult {
	t.Helper()
	if req.Layers == nil {
		req.Layers = minimal
	}
	req.Resources.MemoryMB = 64
	res, err := c.FnCall(ctxT(t), &req)
	if err != nil {
		t.Fatalf("fncall %v%q: %v", req.Cmd, req.Shell, err)
	}
	return res
}

// TestFnCall: calls run in clean sandboxes of a warm pool, wait for a free
// sandbox when the pool is full, and the pool shrinks to nothing when idle.
func TestFnCall(t *testing.T) {
	s := startServer(t, "--fncall-max", "2", "--fncall-idle", "1s", "--fncall-window", "1s")
	c := s.Client
	ctx := ctxT(t)

	t.Run("argv, shell, stdin, env, exit code", func(t *testing.T) {
		r := call(t, c, api.FnCallRequest{Cmd: []string{"sh", "-c", `echo "$X"; cat; exit 4`}, Stdin: "in", Env: map[string]string{"X": "x"}})
		if r.ExitCode != 4 || r.Stdout != "x\nin" {
			t.Fatalf("result %+v", r)
		}
		if r := call(t, c, api.FnCallRequest{Shell: "echo hi"}); r.Stdout != "hi\n" || r.ExitCode != 0 {
			t.Fatalf("shell result %+v", r)
		}
	})

	t.Run("every call starts clean", func(t *testing.T) {
		seen := map[string]int{}
		for range 6 {
			r := call(t, c, api.FnCallRequest{Shell: `test -e /tmp/mark && echo dirty; touch /tmp/mark; echo $DSEC_SANDBOX_ID`})
			if strings.Contains(r.Stdout, "dirty") {
				t.Fatalf("a call saw a file written by an earlier call: %q", r.Stdout)
			}
			seen[strings.TrimSpace(r.Stdout)]++
		}
		if len(seen) > 2 {
			t.Fatalf("6 calls used %d sandboxes of a pool of at most 2: %v", len(seen), seen)
		}
	})

	t.Run("calls that change nothing need no reset", func(t *testing.T) {
		before := poolCounts(t, c)
		for range 5 {
			call(t, c, api.FnCallRequest{Cmd: []string{"cat", "/etc/passwd"}})
		}
		after := poolCounts(t, c)
		if after.Calls-before.Calls != 5 || after.Resets != before.Resets {
			t.Fatalf("5 read-only calls: calls %d→%d, resets %d→%d; want no reset", before.Calls, after.Calls,
				before.Resets, after.Resets)
		}
	})

	t.Run("a full pool makes calls wait, within their timeout", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.FnCall(ctx, &api.FnCallRequest{Layers: minimal, Resources: api.Resources{MemoryMB: 64},
					Shell: "sleep 0.3", TimeoutMs: 60000})
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("a call on a busy pool of 2 failed: %v", err)
			}
		}
		// Two calls hold both sandboxes; a third with a short timeout gives up.
		hold := make(chan struct{})
		for range 2 {
			go func() {
				c.FnCall(ctx, &api.FnCallRequest{Layers: minimal, Resources: api.Resources{MemoryMB: 64}, Shell: "sleep 2"})
				hold <- struct{}{}
			}()
		}
		testutil.Eventually(t, 30*time.Second, "both sandboxes of the pool busy", func() error {
			pools, err := c.ListPools(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pools.Pools {
				if p.Busy >= 2 {
					return nil
				}
			}
			return fmt.Errorf("pools %+v", pools.Pools)
		})
		_, err := c.FnCall(ctx, &api.FnCallRequest{Layers: minimal, Resources: api.Resources{MemoryMB: 64}, Shell: "true", TimeoutMs: 300})
		if client.Code(err) != api.CodeDeadlineExceeded {
			t.Fatalf("call that found no free sandbox within 300 ms: %v; want deadline_exceeded", err)
		}
		<-hold
		<-hold
	})

	t.Run("pool sandboxes take no direct calls", func(t *testing.T) {
		call(t, c, api.FnCallRequest{Shell: "true"})
		list, err := c.ListSandboxes(ctx, client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var pooled *api.Sandbox
		for i, sb := range list.Sandboxes {
			if sb.Labels[api.LabelFnCallPool] != "" {
				pooled = &list.Sandboxes[i]
			}
		}
		if pooled == nil || pooled.Backend != api.BackendFnCall {
			t.Fatalf("no pool sandbox in the tenant's list: %+v", list.Sandboxes)
		}
		_, err = c.Exec(ctx, pooled.ID, &api.ExecRequest{Shell: "true"})
		if client.Code(err) != api.CodeFailedPrecondition {
			t.Fatalf("exec on a pool sandbox: %v; want failed_precondition", err)
		}
		if err := c.DeleteSandbox(ctx, pooled.ID); err != nil {
			t.Fatal(err)
		}
		call(t, c, api.FnCallRequest{Shell: "true"}) // the pool carries on without it
	})

	t.Run("backend fncall on create takes a warm sandbox", func(t *testing.T) {
		call(t, c, api.FnCallRequest{Shell: "true"}) // warm the pool
		sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{Backend: api.BackendFnCall, Layers: minimal,
			Resources: api.Resources{MemoryMB: 64}, Labels: map[string]string{"mine": "1"}})
		if err != nil {
			t.Fatal(err)
		}
		if sb.Backend != api.BackendFnCall || sb.State != api.StateRunning || sb.Labels["mine"] != "1" || sb.Labels[api.LabelFnCallPool] != "" {
			t.Fatalf("created %+v", sb)
		}
		sh(t, c, sb.ID, "echo state > /tmp/s")
		if got := sh(t, c, sb.ID, "cat /tmp/s"); got != "state\n" {
			t.Fatalf("a taken sandbox keeps no state: %q", got)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			req  api.FnCallRequest
			code string
		}{
			{"no command", api.FnCallRequest{Layers: minimal}, api.CodeInvalid},
			{"cmd and shell", api.FnCallRequest{Layers: minimal, Cmd: []string{"true"}, Shell: "true"}, api.CodeInvalid},
			{"no layers", api.FnCallRequest{Shell: "true"}, api.CodeInvalid},
			{"unknown layer", api.FnCallRequest{Layers: &api.LayerRefs{Base: "nope:1"}, Shell: "true"}, api.CodeNotFound},
			{"timeout too long", api.FnCallRequest{Layers: minimal, Shell: "true", TimeoutMs: 3600000}, api.CodeInvalid},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if _, err := c.FnCall(ctx, &tc.req); client.Code(err) != tc.code {
					t.Fatalf("got %v; want %s", err, tc.code)
				}
			})
		}
	})

	t.Run("idle pools shrink to zero", func(t *testing.T) {
		// Shrinking destroys sandboxes in the background: wait for the pools
		// and their sandboxes to be gone.
		testutil.Eventually(t, 2*time.Minute, "the pools and their sandboxes gone after the last call", func() error {
			pools, err := c.ListPools(ctx)
			if err != nil {
				t.Fatal(err)
			}
			list, err := c.ListSandboxes(ctx, client.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(pools.Pools) != 0 || len(list.Sandboxes) != 0 {
				return fmt.Errorf("pools %+v, sandboxes %+v", pools.Pools, list.Sandboxes)
			}
			return nil
		})
		testutil.RequireNoSandboxLeft(t, s)
	})
}

// poolCounts sums the calls and resets of the admin tenant's pools, once
// no reset is in flight.
func poolCounts(t *testing.T, c *client.Client) api.FnCallPool {
	t.Helper()
	var sum api.FnCallPool
	_ = testutil.Poll(time.Minute, func() error { // the caller checks the counts
		pools, err := c.ListPools(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		sum = api.FnCallPool{}
		for _, p := range pools.Pools {
			sum.Calls += p.Calls
			sum.Resets += p.Resets
			sum.Resetting += p.Resetting
		}
		if sum.Resetting != 0 {
			return fmt.Errorf("%d resetting", sum.Resetting)
		}
		return nil
	})
	return sum
}

// TestFnCallStream: a call streams its output as NDJSON like an exec.
func TestFnCallStream(t *testing.T) {
	s := startServer(t)
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, s.URL+"/v1/fncall",
		strings.NewReader(`{"layers":{"base":"base:minimal"},"resources":{"memory_mb":64},"shell":"echo a; sleep 0.2; echo b >&2"}`))
	req.Header.Set("Authorization", "Bearer "+s.Key)
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []string
	buf := new(strings.Builder)
	if _, err := io.Copy(buf, resp.Body); err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(buf.String()), "\n")
	if resp.StatusCode != 200 || len(lines) != 3 || lines[0] != `{"stdout":"a\n"}` || lines[1] != `{"stderr":"b\n"}` ||
		!strings.HasPrefix(lines[2], `{"exit":{"exit_code":0`) {
		t.Fatalf("status %d, stream %q", resp.StatusCode, lines)
	}
}

// TestFnCallPoolsGoWithTheServer: a pool lives only in the server's memory,
// so a graceful stop destroys its sandboxes while the node can still be
// reached; before, one ran on until the next start. Nothing is left.
func TestFnCallPoolsGoWithTheServer(t *testing.T) {
	s := startServer(t)
	if r := call(t, s.Client, api.FnCallRequest{Shell: "echo hi"}); r.Stdout != "hi\n" {
		t.Fatalf("call: %+v", r)
	}
	s.Stop()
	if l := s.SandboxLeaks(); len(l) > 0 {
		t.Fatalf("left behind by a stopped server:\n  %s", strings.Join(l, "\n  "))
	}
}
