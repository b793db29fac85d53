package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// checkpoints checks trajectory settings and checkpoints: a checkpoint
// lists only while its step is recorded, done, as the attempt it was taken
// after; dropped and stale ones are dead; steps move to a restored sandbox.
func checkpoints(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	const traj = "job/ep-2"

	if _, err := s.GetTrajectory(ctx, "a", traj); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("settings of an unknown trajectory: %v", err)
	}
	for _, every := range []int64{3, 5} {
		if err := s.PutTrajectory(ctx, store.Trajectory{Tenant: "a", ID: traj, CheckpointEvery: every, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if tr, err := s.GetTrajectory(ctx, "a", traj); err != nil || tr.CheckpointEvery != 5 {
		t.Fatalf("settings = %+v, %v; want every 5", tr, err)
	}
	if _, err := s.GetTrajectory(ctx, "b", traj); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant sees the settings: %v", err)
	}

	run := func(n int64, sandbox string) store.Step {
		st := store.Step{Tenant: "a", Trajectory: traj, Step: n, Fingerprint: fmt.Sprintf("fp-%d", n),
			Attempt: fmt.Sprintf("a-%d-%s", n, sandbox), Sandbox: sandbox, StartedAt: now,
			Result: &api.ExecResult{ExitCode: 0}}
		if err := s.BeginStep(ctx, st); err != nil {
			t.Fatal(err)
		}
		if err := s.FinishStep(ctx, st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	ckpt := func(st store.Step) store.Checkpoint {
		c := store.Checkpoint{Tenant: "a", Trajectory: traj, Step: st.Step, Attempt: st.Attempt,
			LayerName: "checkpoint/" + st.Sandbox, LayerTag: fmt.Sprintf("%d-%s", st.Step, st.Attempt),
			Digest: fmt.Sprintf("sha256:%064d", st.Step), Size: 100 * st.Step, Sandbox: st.Sandbox,
			Spec: []byte(`{"backend":"container"}`), CreatedAt: now}
		if err := s.AddCheckpoint(ctx, c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	steps := map[int64]store.Step{}
	for i := int64(1); i <= 7; i++ {
		steps[i] = run(i, "sb-1")
	}
	c3, c6 := ckpt(steps[3]), ckpt(steps[6])
	if err := s.AddCheckpoint(ctx, c3); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("the same checkpoint twice: %v", err)
	}
	live := func() []int64 {
		t.Helper()
		list, err := s.ListCheckpoints(ctx, "a", traj)
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for _, c := range list {
			out = append(out, c.Step)
		}
		return out
	}
	dead := func() map[int64]bool {
		t.Helper()
		list, err := s.DeadCheckpoints(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		out := map[int64]bool{}
		for _, c := range list {
			out[c.Step] = true
		}
		return out
	}
	if got := live(); fmt.Sprint(got) != "[3 6]" {
		t.Fatalf("live checkpoints %v, want [3 6]", got)
	}
	list, _ := s.ListCheckpoints(ctx, "a", traj)
	if c := list[1]; c.Digest != c6.Digest || c.LayerTag != c6.LayerTag || string(c.Spec) != string(c6.Spec) ||
		c.Size != 600 || !c.CreatedAt.Equal(now) || c.Dropped {
		t.Fatalf("read back %+v, want %+v", c, c6)
	}
	if list, _ := s.ListCheckpoints(ctx, "b", traj); len(list) != 0 {
		t.Fatalf("another tenant lists checkpoints: %+v", list)
	}
	if d := dead(); len(d) != 0 {
		t.Fatalf("dead checkpoints before any drop: %v", d)
	}

	// A restore moves the steps up to the checkpoint to the new sandbox;
	// later ones stay.
	n, err := s.MoveSteps(ctx, "a", traj, 6, store.StepPlace{Sandbox: "sb-2"})
	if err != nil || n != 6 {
		t.Fatalf("moved %d steps, %v; want 6", n, err)
	}
	for i := int64(1); i <= 7; i++ {
		st, err := s.GetStep(ctx, "a", traj, i)
		want := "sb-2"
		if i == 7 {
			want = "sb-1"
		}
		if err != nil || st.Sandbox != want || st.Attempt != steps[i].Attempt {
			t.Fatalf("step %d after the move: %+v %v; want in %s", i, st, err, want)
		}
	}
	if got := live(); fmt.Sprint(got) != "[3 6]" {
		t.Fatalf("checkpoints after a move %v, want [3 6]", got)
	}

	// Dropping one makes it dead; a step that runs again at or before a
	// checkpoint makes that one dead too.
	if err := s.DropCheckpoint(ctx, c3); err != nil {
		t.Fatal(err)
	}
	if got, d := live(), dead(); fmt.Sprint(got) != "[6]" || !d[3] {
		t.Fatalf("after dropping 3: live %v dead %v", got, d)
	}
	run(5, "sb-2")
	if got, d := live(), dead(); len(got) != 0 || !d[6] {
		t.Fatalf("after step 5 ran again: live %v dead %v", got, d)
	}
	for _, c := range []store.Checkpoint{c3, c6} {
		if err := s.DeleteCheckpoint(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if d := dead(); len(d) != 0 {
		t.Fatalf("dead checkpoints after deleting them: %v", d)
	}

	// Purging the trajectory's steps kills its checkpoints and, once old
	// enough, its settings.
	ckpt(run(6, "sb-2"))
	if got := live(); fmt.Sprint(got) != "[6]" {
		t.Fatalf("live %v, want [6]", got)
	}
	if _, err := s.PurgeTrajectories(ctx, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, d := live(), dead(); len(got) != 0 || !d[6] {
		t.Fatalf("after the purge: live %v dead %v", got, d)
	}
	if _, err := s.GetTrajectory(ctx, "a", traj); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("settings after the purge: %v", err)
	}
}

// layersInUse checks DeleteLayer and LayerInUse: a digest is in use while
// a layer record has it or stacks on it, or a live sandbox runs on it.
func layersInUse(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC()
	d := func(i int) string { return fmt.Sprintf("sha256:%064d", i) }
	put := func(tenant, name, digest string, parents ...string) {
		if err := s.PutLayer(ctx, store.Layer{Tenant: tenant, Name: name, Tag: "1", Digest: digest,
			Kind: api.KindSnapshot, CreatedAt: now, Parents: parents}); err != nil {
			t.Fatal(err)
		}
	}
	inUse := func(digest string) bool {
		t.Helper()
		ok, err := s.LayerInUse(ctx, digest)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	put("a", "snap/one", d(1))
	put("b", "snap/two", d(2), d(1))
	if !inUse(d(1)) || !inUse(d(2)) || inUse(d(3)) {
		t.Fatalf("in use: 1=%v 2=%v 3=%v", inUse(d(1)), inUse(d(2)), inUse(d(3)))
	}
	if err := s.DeleteLayer(ctx, "a", "snap/one", "1", d(9)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLayer(ctx, "a", "snap/one", "1"); err != nil {
		t.Fatalf("a delete with another digest removed the layer: %v", err)
	}
	if err := s.DeleteLayer(ctx, "a", "snap/one", "1", d(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLayer(ctx, "a", "snap/one", "1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted layer still there: %v", err)
	}
	if !inUse(d(1)) {
		t.Fatal("a parent of another tenant's layer is not in use")
	}
	if err := s.DeleteLayer(ctx, "b", "snap/two", "1", d(2)); err != nil {
		t.Fatal(err)
	}
	if inUse(d(1)) || inUse(d(2)) {
		t.Fatal("digests in use after their layers went")
	}
	sb := store.Sandbox{API: api.Sandbox{ID: "sb-x", State: api.StateRunning, CreatedAt: now}, Tenant: "a",
		LayerDigests: []string{d(5), d(1)}, LastActive: now}
	if err := s.CreateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	if !inUse(d(1)) {
		t.Fatal("a live sandbox's layer is not in use")
	}
	sb.API.State, sb.DeletedAt = api.StateDeleted, &now
	if err := s.UpdateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	if inUse(d(1)) {
		t.Fatal("a deleted sandbox's layer is still in use")
	}
	if err := s.DeleteLayer(ctx, "a", "nope", "1", d(1)); err != nil {
		t.Fatalf("deleting a missing layer: %v", err)
	}
}

// unusedLayers checks UnusedLayers: layers of a prefix, older than the
// cut-off, that no other record has or stacks on and no live sandbox
// runs on, of any tenant.
func unusedLayers(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC()
	old := now.Add(-time.Hour)
	d := func(i int) string { return fmt.Sprintf("sha256:%064d", 100+i) }
	put := func(tenant, name, digest string, at time.Time, parents ...string) {
		t.Helper()
		if err := s.PutLayer(ctx, store.Layer{Tenant: tenant, Name: name, Tag: "1", Digest: digest,
			Kind: api.KindSnapshot, CreatedAt: at, Parents: parents}); err != nil {
			t.Fatal(err)
		}
	}
	unused := func(prefix string) []string {
		t.Helper()
		list, err := s.UnusedLayers(ctx, prefix, now.Add(-time.Minute), 100)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range list {
			out = append(out, l.Tenant+"/"+l.Name)
		}
		slices.Sort(out)
		return out
	}
	put("a", "fork/sb-1:fk-1", d(1), old)                 // its copies are gone: unused
	put("b", "fork/sb-2:fk-2", d(2), old)                 // a live copy runs on it
	put("a", "fork/sb-3:fk-3", d(3), now)                 // too young (a fork being made)
	put("a", "fork/sb-4:fk-4", d(4), old)                 // a snapshot stacks on it
	put("a", "snap/of-copy", d(5), old, d(4))             //
	put("a", "build-cache/k1", d(6), old)                 // the final layer stacks on it
	put("a", "build-cache/k2", d(7), old, d(6))           // the last step, tagged by the user too
	put("a", "app", d(7), old, d(6))                      //
	put("a", "build-cache/k3", d(8), old.Add(-time.Hour)) // flattened away: unused
	put("a", "mine", d(9), old)                           // not dsec's
	sb := store.Sandbox{API: api.Sandbox{ID: "sb-unused", State: api.StateRunning, CreatedAt: now}, Tenant: "b",
		LayerDigests: []string{d(0), d(2)}, LastActive: now}
	if err := s.CreateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	if got := unused("fork/"); !slices.Equal(got, []string{"a/fork/sb-1:fk-1"}) {
		t.Fatalf("unused fork layers: %v", got)
	}
	if got := unused("build-cache/"); !slices.Equal(got, []string{"a/build-cache/k3"}) {
		t.Fatalf("unused build cache layers: %v", got)
	}
	// Once its users are gone, a layer is unused.
	sb.API.State, sb.DeletedAt = api.StateDeleted, &now
	if err := s.UpdateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteLayer(ctx, "a", "snap/of-copy", "1", d(5)); err != nil {
		t.Fatal(err)
	}
	if got := unused("fork/"); !slices.Equal(got, []string{"a/fork/sb-1:fk-1", "a/fork/sb-4:fk-4", "b/fork/sb-2:fk-2"}) {
		t.Fatalf("unused fork layers after their users went: %v", got)
	}
	if err := s.DeleteLayer(ctx, "a", "app", "1", d(7)); err != nil {
		t.Fatal(err)
	}
	if got := unused("build-cache/"); !slices.Equal(got, []string{"a/build-cache/k2", "a/build-cache/k3"}) {
		t.Fatalf("unused build cache layers after the app went: %v", got)
	}
	if list, err := s.UnusedLayers(ctx, "fork/", now, 1); err != nil || len(list) != 1 {
		t.Fatalf("limit 1: %v %v", list, err)
	}
}
