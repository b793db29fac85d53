package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// checkpointSteps waits until the trajectory's checkpoints are at steps.
func checkpointSteps(t *testing.T, c *client.Client, traj string, steps ...int64) []api.Checkpoint {
	t.Helper()
	want := fmt.Sprint(steps)
	var cps []api.Checkpoint
	testutil.Eventually(t, 2*time.Minute, fmt.Sprintf("checkpoints of %s at steps %v", traj, want), func() error {
		l, err := c.GetTrajectory(ctxT(t), traj)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, cp := range l.Checkpoints {
			got = append(got, cp.Step)
		}
		if fmt.Sprint(got) != want {
			return fmt.Errorf("at steps %v", got)
		}
		cps = l.Checkpoints
		return nil
	})
	return cps
}

// manifestGone waits until the layer store no longer holds the layer.
func manifestGone(t *testing.T, s *testutil.Server, digest string) {
	t.Helper()
	path := filepath.Join(s.DataDir, "store", "layers", "sha256", strings.TrimPrefix(digest, "sha256:"))
	testutil.EventuallyTrue(t, time.Minute, "layer "+digest+" gone from the store", func() bool {
		_, err := os.Stat(path)
		return os.IsNotExist(err)
	})
}

// TestTrajectoryCheckpoints is the lost-sandbox story: a trainer that asks
// for a checkpoint every 3 steps runs 7 steps, each appending a line to a
// file; its sandbox is then lost. The trainer restores the trajectory from
// its newest checkpoint (after step 6) into a new sandbox and replays steps
// 1 to 10: 1 to 6 come back from the log, 7 to 10 run, and the file has
// each line exactly once. After each step's answer the trainer at once
// touches a file with a plain exec, which must wait for the checkpoint:
// the checkpoint shows the state right after its step.
func TestTrajectoryCheckpoints(t *testing.T) {
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)
	old := newSandbox(t, c, nil)
	sh(t, c, old.ID, "mkdir /work")
	const traj = "job-9/episode-4"

	_, lines := trainer(t, s, old.ID, traj, 7, "TRAINER_CHECKPOINT_EVERY=3", "TRAINER_MARK=1")
	got := stepsOf(t, lines)
	for i := int64(1); i <= 7; i++ {
		if got[i].Replayed || got[i].Stdout != fmt.Sprintf("did %d\n", i) {
			t.Fatalf("first run, step %d: %+v", i, got[i])
		}
	}
	ckpts := checkpointSteps(t, c, traj, 3, 6)
	if ckpts[1].Sandbox != old.ID || !strings.HasPrefix(ckpts[1].Snapshot, "checkpoint/"+old.ID+":6-") {
		t.Fatalf("checkpoint 6: %+v", ckpts[1])
	}
	if l, err := c.GetTrajectory(ctx, traj); err != nil || l.CheckpointEvery != 3 {
		t.Fatalf("the trajectory's setting: %+v %v", l, err)
	}
	if lay, err := c.GetLayer(ctx, ckpts[1].Snapshot); err != nil || lay.Kind != api.KindSnapshot || lay.Digest != ckpts[1].Digest {
		t.Fatalf("checkpoint layer: %+v %v", lay, err)
	}

	// The sandbox is lost.
	if err := c.DeleteSandbox(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, old.ID, stepReq(traj, 8, stepCmd(8))); !client.IsNotFound(err) {
		t.Fatalf("a step in the lost sandbox: %v", err)
	}

	res, err := c.RestoreTrajectory(ctx, &api.RestoreRequest{Trajectory: traj})
	if err != nil {
		t.Fatal(err)
	}
	sb := res.Sandbox
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	if res.Checkpoint.Step != 6 || sb.ID == old.ID || sb.State != api.StateRunning || sb.Snapshot != ckpts[1].Snapshot ||
		sb.Resources.MemoryMB != 128 {
		t.Fatalf("restored %+v from %+v", sb, res.Checkpoint)
	}
	if log := sh(t, c, sb.ID, "cat /work/log"); log != "step 1\nstep 2\nstep 3\nstep 4\nstep 5\nstep 6\n" {
		t.Fatalf("the checkpoint holds /work/log =\n%s", log)
	}
	// The trainer wrote after-N right after step N's answer: the
	// checkpoint after step 6 shows the state after step 6, not after-6.
	if ls := sh(t, c, sb.ID, "cd /work && echo after-*"); ls != "after-1 after-2 after-3 after-4 after-5\n" {
		t.Fatalf("the checkpoint holds %q", ls)
	}

	_, lines = trainer(t, s, sb.ID, traj, 10)
	got = stepsOf(t, lines)
	if len(got) != 10 {
		t.Fatalf("the restored trainer finished %d steps: %+v", len(got), got)
	}
	for i := int64(1); i <= 10; i++ {
		if want := i <= 6; got[i].Replayed != want || got[i].Stdout != fmt.Sprintf("did %d\n", i) {
			t.Errorf("step %d: %+v, want replayed=%v", i, got[i], want)
		}
	}
	var want strings.Builder
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&want, "step %d\n", i)
	}
	if log := sh(t, c, sb.ID, "cat /work/log"); log != want.String() {
		t.Fatalf("after the replay /work/log =\n%s\nwant each step once:\n%s", log, want.String())
	}
	l, err := c.GetTrajectory(ctx, traj)
	if err != nil || len(l.Steps) != 10 {
		t.Fatalf("log after the replay: %+v %v", l, err)
	}
	for _, st := range l.Steps {
		if st.Sandbox != sb.ID {
			t.Errorf("step %d is in %s, want the restored %s", st.Step, st.Sandbox, sb.ID)
		}
	}

	t.Run("older checkpoints are collected", func(t *testing.T) {
		// Step 9 took a checkpoint in the restored sandbox; two are kept,
		// so the one at 3 went, with its layer.
		now := checkpointSteps(t, c, traj, 6, 9)
		if now[1].Sandbox != sb.ID {
			t.Fatalf("checkpoint 9: %+v", now[1])
		}
		manifestGone(t, s, ckpts[0].Digest)
		if _, err := c.GetLayer(ctx, ckpts[0].Snapshot); !client.IsNotFound(err) {
			t.Fatalf("the layer of a dropped checkpoint: %v", err)
		}
		if r, err := c.RestoreTrajectory(ctx, &api.RestoreRequest{Trajectory: traj, Step: 3}); !client.IsNotFound(err) {
			t.Fatalf("restore from a dropped checkpoint: %+v %v", r, err)
		}
	})

	t.Run("an older checkpoint restores again", func(t *testing.T) {
		// The restored sandbox may be lost too: a kept checkpoint restores
		// as often as needed, each time into a sandbox where its steps
		// replay.
		r, err := c.RestoreTrajectory(ctx, &api.RestoreRequest{Trajectory: traj, Step: 6, TTLSeconds: 600})
		if err != nil {
			t.Fatal(err)
		}
		defer c.DeleteSandbox(context.Background(), r.Sandbox.ID)
		if r.Checkpoint.Step != 6 || r.Sandbox.TTLSeconds != 600 {
			t.Fatalf("restore from step 6: %+v", r)
		}
		for i := int64(1); i <= 6; i++ {
			if res := execStep(t, c, r.Sandbox.ID, stepReq(traj, i, stepCmd(i))); !res.Replayed {
				t.Fatalf("step %d in the second restore ran: %+v", i, res)
			}
		}
		if n := sh(t, c, r.Sandbox.ID, "wc -l < /work/log"); strings.TrimSpace(n) != "6" {
			t.Fatalf("/work/log has %s lines", n)
		}
		if err := c.DeleteSandbox(ctx, r.Sandbox.ID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a divergence before a checkpoint drops it", func(t *testing.T) {
		res := execStep(t, c, sb.ID, stepReq(traj, 8, "echo other >> /work/log"))
		if res.Replayed {
			t.Fatalf("divergent step 8: %+v", res)
		}
		checkpointSteps(t, c, traj, 6)
		if r, err := c.RestoreTrajectory(ctx, &api.RestoreRequest{Trajectory: traj, Step: 9}); !client.IsNotFound(err) {
			t.Fatalf("restore from the checkpoint of another history: %+v %v", r, err)
		}
	})

	t.Run("deleting the trajectory collects its checkpoints", func(t *testing.T) {
		last := checkpointSteps(t, c, traj, 6)
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteTrajectory(ctx, traj, 0); err != nil {
			t.Fatal(err)
		}
		manifestGone(t, s, last[0].Digest)
		layers, err := c.ListLayers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, lay := range layers {
			if strings.HasPrefix(lay.Name, "checkpoint/") {
				t.Errorf("checkpoint layer left: %+v", lay)
			}
		}
		if _, err := c.GetTrajectory(ctx, traj); !client.IsNotFound(err) {
			t.Fatalf("the deleted trajectory: %v", err)
		}
	})
}

// TestTrajectoryCheckpointBadInput checks the refusals of checkpoints and
// restores: every one a 4xx error object.
// TestCheckpointsStop: checkpoint_every -1 on a step stops the
// trajectory's checkpoints; the ones taken stay.
func TestCheckpointsStop(t *testing.T) {
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)
	sb := newSandbox(t, c, nil)
	const traj = "stop-ckpt"
	first := stepReq(traj, 1, "echo 1 >> /log")
	first.Trajectory.CheckpointEvery = 1
	execStep(t, c, sb.ID, first)
	checkpointSteps(t, c, traj, 1)

	stop := stepReq(traj, 2, "echo 2 >> /log")
	stop.Trajectory.CheckpointEvery = -1
	execStep(t, c, sb.ID, stop)
	execStep(t, c, sb.ID, stepReq(traj, 3, "echo 3 >> /log"))
	// A checkpoint after step 2 or 3 would hold this back until taken.
	if got := sh(t, c, sb.ID, "cat /log"); got != "1\n2\n3\n" {
		t.Fatalf("/log = %q", got)
	}
	l, err := c.GetTrajectory(ctx, traj)
	if err != nil || l.CheckpointEvery != 0 || len(l.Checkpoints) != 1 || l.Checkpoints[0].Step != 1 {
		t.Fatalf("after checkpoint_every -1: %+v, %v; want no interval and the checkpoint at step 1 only", l, err)
	}
}

func TestTrajectoryCheckpointBadInput(t *testing.T) {
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)
	sb := newSandbox(t, c, nil)
	execStep(t, c, sb.ID, stepReq("plain", 1, "true")) // a trajectory without checkpoints

	t.Run("exec", func(t *testing.T) {
		for _, every := range []int64{-2, 1 << 53} {
			req := &api.ExecRequest{Shell: "true", Trajectory: &api.Trajectory{ID: "bad", Step: 1, CheckpointEvery: every}}
			if _, err := c.Exec(ctx, sb.ID, req); client.Code(err) != api.CodeInvalid {
				t.Errorf("checkpoint_every %d: %v", every, err)
			}
		}
	})
	t.Run("restore", func(t *testing.T) {
		tests := []struct {
			name string
			req  api.RestoreRequest
			code string
		}{
			{"no trajectory", api.RestoreRequest{}, api.CodeInvalid},
			{"bad id", api.RestoreRequest{Trajectory: "/bad"}, api.CodeInvalid},
			{"negative step", api.RestoreRequest{Trajectory: "plain", Step: -1}, api.CodeInvalid},
			{"negative ttl", api.RestoreRequest{Trajectory: "plain", TTLSeconds: -1}, api.CodeInvalid},
			{"unknown trajectory", api.RestoreRequest{Trajectory: "nope"}, api.CodeNotFound},
			{"no checkpoint", api.RestoreRequest{Trajectory: "plain"}, api.CodeNotFound},
			{"no checkpoint at that step", api.RestoreRequest{Trajectory: "plain", Step: 1}, api.CodeNotFound},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				if r, err := c.RestoreTrajectory(ctx, &tc.req); client.Code(err) != tc.code {
					t.Fatalf("restore = %+v, %v; want %s", r, err, tc.code)
				}
			})
		}
		for name, body := range map[string]string{
			"unknown field": `{"trajectory": "plain", "every": 3}`,
			"not json":      `trajectory=plain`,
		} {
			t.Run(name, func(t *testing.T) {
				resp, err := http.DefaultClient.Do(authed(t, s.Key, http.MethodPost, s.URL+"/v1/trajectories:restore", body))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusBadRequest {
					t.Fatalf("status %d", resp.StatusCode)
				}
			})
		}
	})
	t.Run("checkpoint names are reserved", func(t *testing.T) {
		if _, err := c.Snapshot(ctx, sb.ID, "checkpoint/mine:1"); client.Code(err) != api.CodeInvalid {
			t.Fatalf("a snapshot named checkpoint/…: %v", err)
		}
	})
	t.Run("another tenant cannot restore", func(t *testing.T) {
		every := &api.ExecRequest{Shell: "echo x >> /f", Trajectory: &api.Trajectory{ID: "mine", Step: 1, CheckpointEvery: 1}}
		execStep(t, c, sb.ID, every)
		checkpointSteps(t, c, "mine", 1)
		tn, err := c.CreateTenant(ctx, "ckpt-other")
		if err != nil {
			t.Fatal(err)
		}
		k, err := c.CreateKey(ctx, tn.ID, false)
		if err != nil {
			t.Fatal(err)
		}
		oc := client.New(s.URL, k.Secret)
		if r, err := oc.RestoreTrajectory(ctx, &api.RestoreRequest{Trajectory: "mine"}); !client.IsNotFound(err) {
			t.Fatalf("another tenant restored: %+v %v", r, err)
		}
	})
}

// TestCheckpointCrashThawed kills the server while a checkpoint has the
// sandbox frozen: the restarted node thaws it (the freeze was a
// snapshot's, not a pause), so its commands run again.
func TestCheckpointCrashThawed(t *testing.T) {
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal"},
		Resources: api.Resources{MemoryMB: 512}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	// Enough data that packing it keeps the sandbox frozen a while.
	sh(t, c, sb.ID, "head -c 200000000 /dev/urandom > /big")
	execStep(t, c, sb.ID, &api.ExecRequest{Shell: "true",
		Trajectory: &api.Trajectory{ID: "crash-ckpt", Step: 1, CheckpointEvery: 1}})
	runcRoot := filepath.Join(s.DataDir, "edge", "container", "runc")
	// The freeze lasts only while the checkpoint packs: look often.
	if err := testutil.PollEvery(time.Minute, 5*time.Millisecond, func() error {
		out, _ := exec.Command("runc", "--root", runcRoot, "state", sb.ID).Output()
		if !strings.Contains(string(out), `"status": "paused"`) {
			return fmt.Errorf("runc state: %s", out)
		}
		return nil
	}); err != nil {
		t.Fatalf("the checkpoint never froze the sandbox: %v", err)
	}
	s.Kill()
	s.Restart()
	c = s.Client
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := c.Exec(ectx, sb.ID, &api.ExecRequest{Shell: "echo thawed"})
	if err != nil || res.Stdout != "thawed\n" {
		t.Fatalf("exec after the restart: %+v %v", res, err)
	}
	// A sandbox paused through the API stays paused across a restart.
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	s.Restart()
	c = s.Client
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != api.StatePaused {
		t.Fatalf("paused sandbox after a restart: %+v %v", got, err)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, c, sb.ID, "echo resumed"); got != "resumed\n" {
		t.Fatalf("after resume: %q", got)
	}
}
