package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// idle checks the idle-timeout filter (last activity + timeout, only for
// sandboxes that have one) and that Generation survives a round trip.
func idle(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	for _, tc := range []struct {
		id      string
		idle    int64 // seconds
		touched time.Duration
	}{
		{"sb-none", 0, -time.Hour},         // no idle timeout: never idle
		{"sb-stale", 60, -2 * time.Minute}, // idle for 2 min, timeout 1 min
		{"sb-fresh", 60, -30 * time.Second},
	} {
		sb := store.Sandbox{
			API:    api.Sandbox{ID: tc.id, State: api.StateRunning, IdleTimeoutSeconds: tc.idle, CreatedAt: now},
			Tenant: "a", LastActive: now.Add(tc.touched), Generation: 3,
		}
		if err := s.CreateSandbox(ctx, &sb); err != nil {
			t.Fatal(err)
		}
	}
	list, _, err := s.ListSandboxes(ctx, store.SandboxFilter{AllTenants: true, IdleBy: &now})
	if err != nil || len(list) != 1 || list[0].API.ID != "sb-stale" {
		t.Fatalf("idle filter = %v, %v; want sb-stale only", ids(list), err)
	}
	if err := s.TouchSandbox(ctx, "sb-stale", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if list, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{AllTenants: true, IdleBy: &now}); len(list) != 0 {
		t.Fatalf("idle after a touch: %v", ids(list))
	}
	later := now.Add(90 * time.Second)
	if list, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{AllTenants: true, IdleBy: &later}); len(list) != 1 || list[0].API.ID != "sb-fresh" {
		t.Fatalf("idle 90 s later: %v, want sb-fresh", ids(list))
	}
	sb, err := s.GetSandbox(ctx, "sb-fresh")
	if err != nil || sb.Generation != 3 || sb.API.IdleTimeoutSeconds != 60 {
		t.Fatalf("read back %+v, %v", sb, err)
	}
	sb.API.IdleTimeoutSeconds = 0 // an update changes what the filter sees
	if err := s.UpdateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	if list, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{AllTenants: true, IdleBy: &later}); len(list) != 0 {
		t.Fatalf("idle after its timeout was removed: %v", ids(list))
	}
}

func ids(list []store.Sandbox) []string {
	var out []string
	for _, sb := range list {
		out = append(out, sb.API.ID)
	}
	return out
}

// steps checks the trajectory log: begin, finish, replace from a step on,
// tenant scoping, deletion, purge by age, and durability across reopen.
func steps(t *testing.T, s store.Store, reopen func(*testing.T) store.Store) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	step := func(tenant string, n int64) store.Step {
		return store.Step{
			Tenant: tenant, Trajectory: "job/ep-1", Step: n, Fingerprint: fmt.Sprintf("fp-%d", n),
			Attempt: fmt.Sprintf("a-%d", n), Sandbox: "sb-1", Generation: 2, StartedAt: now,
		}
	}
	record := func(st store.Step, stdout string) {
		t.Helper()
		if err := s.BeginStep(ctx, st); err != nil {
			t.Fatal(err)
		}
		st.Result = &api.ExecResult{ExitCode: int(st.Step), Stdout: stdout, DurationMs: 5}
		if err := s.FinishStep(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	for i := range int64(5) {
		record(step("a", i+1), fmt.Sprintf("out %d\n", i+1))
	}
	record(step("b", 1), "tenant b")

	got, err := s.GetStep(ctx, "a", "job/ep-1", 3)
	if err != nil || got.State != api.StepDone || got.Fingerprint != "fp-3" || got.Sandbox != "sb-1" ||
		got.Generation != 2 || got.Result == nil || got.Result.Stdout != "out 3\n" || got.Result.ExitCode != 3 ||
		got.ExitCode == nil || *got.ExitCode != 3 || got.RecordedAt == nil || !got.StartedAt.Equal(now) {
		t.Fatalf("GetStep = %+v (result %+v), %v", got, got.Result, err)
	}
	if _, err := s.GetStep(ctx, "c", "job/ep-1", 3); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's step: %v", err)
	}
	if b, err := s.GetStep(ctx, "b", "job/ep-1", 1); err != nil || b.Result.Stdout != "tenant b" {
		t.Fatalf("tenant b's step 1: %+v %v", b, err)
	}

	// Replays are counted on the recorded attempt only.
	replayedAt := now.Add(time.Second)
	for range 2 {
		if err := s.StepReplayed(ctx, step("a", 2), replayedAt); err != nil {
			t.Fatal(err)
		}
	}
	stray := step("a", 2)
	stray.Attempt = "someone-else"
	if err := s.StepReplayed(ctx, stray, replayedAt); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetStep(ctx, "a", "job/ep-1", 2); err != nil || got.Replays != 2 || got.ReplayedAt == nil || !got.ReplayedAt.Equal(replayedAt) {
		t.Fatalf("step 2 after two replays: replays %d at %v, %v", got.Replays, got.ReplayedAt, err)
	}
	if l, err := s.ListSteps(ctx, "a", "job/ep-1"); err != nil || l[1].Replays != 2 || l[0].Replays != 0 || l[0].ReplayedAt != nil {
		t.Fatalf("listed replays: %+v, %v", l, err)
	}

	// A step that runs again replaces the history from there on.
	again := step("a", 3)
	again.Fingerprint, again.Attempt = "fp-new", "a-new"
	if err := s.BeginStep(ctx, again); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListSteps(ctx, "a", "job/ep-1")
	if err != nil || len(list) != 3 || list[2].State != api.StepRunning || list[2].Fingerprint != "fp-new" ||
		list[2].ExitCode != nil || list[0].Result != nil || list[1].ExitCode == nil {
		t.Fatalf("after re-running step 3: %+v, %v", list, err)
	}
	stale := step("a", 3) // the old attempt may not finish it
	stale.Result = &api.ExecResult{}
	if err := s.FinishStep(ctx, stale); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("finish by a stale attempt: %v, want ErrConflict", err)
	}
	again.Result = &api.ExecResult{ExitCode: 9}
	if err := s.FinishStep(ctx, again); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishStep(ctx, again); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("finishing twice: %v, want ErrConflict", err)
	}

	if n, err := s.DeleteSteps(ctx, "a", "job/ep-1", 3); err != nil || n != 1 {
		t.Fatalf("DeleteSteps from 3 = %d, %v", n, err)
	}
	if n, err := s.DeleteSteps(ctx, "a", "nope", 0); err != nil || n != 0 {
		t.Fatalf("DeleteSteps of an unknown trajectory = %d, %v", n, err)
	}

	// Purge goes by a trajectory's newest step: a young step keeps the
	// whole trajectory, old steps included.
	old := step("a", 1)
	old.Trajectory, old.StartedAt = "old", now.Add(-48*time.Hour)
	record(old, "")
	mixed := old
	mixed.Trajectory = "mixed"
	record(mixed, "")
	mixed.Step, mixed.StartedAt = 2, now
	record(mixed, "")
	n, err := s.PurgeTrajectories(ctx, now.Add(-24*time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("purge = %d, %v; want the one step of trajectory old", n, err)
	}
	if l, _ := s.ListSteps(ctx, "a", "mixed"); len(l) != 2 {
		t.Fatalf("a trajectory with a recent step lost steps: %+v", l)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := reopen(t)
	if l, err := s2.ListSteps(ctx, "a", "job/ep-1"); err != nil || len(l) != 2 {
		t.Fatalf("steps after reopen: %+v, %v", l, err)
	}
}
