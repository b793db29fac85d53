package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// CheckpointConfig sets up the checkpoint part of `dsec bench trajectory`.
type CheckpointConfig struct {
	Client *client.Client
	Base   string
	// Steps is how many checkpointed steps (and as many plain ones) are
	// timed; DataMB how much data the sandbox has written before, which
	// every checkpoint packs (a snapshot holds all the sandbox's changes).
	Steps, DataMB int
	Prefix        string
	Out           io.Writer
}

// Checkpoints times what a checkpoint costs a trainer, in one sandbox and
// interleaved so both see the same conditions: a step whose trajectory
// checkpoints after it against a recorded step without, each followed at
// once by a plain exec — which waits for the checkpoint, since nothing
// may reach the sandbox before it is taken. The step's own answer does not
// wait. Then a restore from a checkpoint against a create of the same
// sandbox from its layers.
func Checkpoints(ctx context.Context, cfg CheckpointConfig) error {
	w, c := cfg.Out, cfg.Client
	spec := &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: cfg.Base}, Resources: api.Resources{CPU: 1, MemoryMB: 256}}
	sb, err := c.CreateSandbox(ctx, spec)
	if err != nil {
		return err
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	if cfg.DataMB > 0 {
		fill := fmt.Sprintf("mkdir -p /data && head -c %d /dev/urandom > /data/blob", cfg.DataMB<<20)
		if res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: fill}); err != nil || res.ExitCode != 0 {
			return fmt.Errorf("write %d MiB into the sandbox: %v %+v", cfg.DataMB, err, res)
		}
	}
	ck, plain := cfg.Prefix+"-ckpt", cfg.Prefix+"-nockpt"
	defer c.DeleteTrajectory(context.WithoutCancel(ctx), ck, 0)
	defer c.DeleteTrajectory(context.WithoutCancel(ctx), plain, 0)
	const cmd = "echo step >> /log"
	var stepNo, stepCk, nextNo, nextCk []time.Duration
	pair := func(traj string, step int64, every int64) (time.Duration, time.Duration, error) {
		t0 := time.Now()
		res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: cmd,
			Trajectory: &api.Trajectory{ID: traj, Step: step, CheckpointEvery: every}})
		if err != nil {
			return 0, 0, err
		}
		if res.Replayed {
			return 0, 0, fmt.Errorf("step %d of %s replayed", step, traj)
		}
		t1 := time.Now()
		if _, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "true"}); err != nil {
			return 0, 0, err
		}
		return t1.Sub(t0), time.Since(t1), nil
	}
	for i := 1; i <= cfg.Steps; i++ {
		a, b, err := pair(plain, int64(i), 0)
		if err != nil {
			return err
		}
		stepNo, nextNo = append(stepNo, a), append(nextNo, b)
		if a, b, err = pair(ck, int64(i), 1); err != nil {
			return err
		}
		stepCk, nextCk = append(stepCk, a), append(nextCk, b)
	}
	l, err := c.GetTrajectory(ctx, ck)
	if err != nil {
		return err
	}
	if len(l.Checkpoints) == 0 {
		return fmt.Errorf("trajectory %s took no checkpoint", ck)
	}
	last := l.Checkpoints[len(l.Checkpoints)-1]

	// Restore against a create from layers, one at a time, alternating.
	var restore, create []time.Duration
	for range 3 {
		t0 := time.Now()
		r, err := c.RestoreTrajectory(ctx, &api.RestoreRequest{Trajectory: ck})
		if err != nil {
			return err
		}
		restore = append(restore, time.Since(t0))
		if err := c.DeleteSandbox(ctx, r.Sandbox.ID); err != nil {
			return err
		}
		t0 = time.Now()
		n, err := c.CreateSandbox(ctx, spec)
		if err != nil {
			return err
		}
		create = append(create, time.Since(t0))
		if err := c.DeleteSandbox(ctx, n.ID); err != nil {
			return err
		}
	}

	fmt.Fprintf(w, "\ncheckpoints: %d steps each way, the sandbox holding %d MiB written (checkpoint layer %.1f MiB)\n",
		cfg.Steps, cfg.DataMB, float64(last.Size)/(1<<20))
	fmt.Fprintf(w, "%-48s %10s %10s\n", "measure", "p50", "p99")
	row := func(name string, s stats) { fmt.Fprintf(w, "%-48s %10s %10s\n", name, ms(s.p50), ms(s.p99)) }
	sNo, sCk, nNo, nCk := summarize(stepNo), summarize(stepCk), summarize(nextNo), summarize(nextCk)
	row("baseline: recorded step, no checkpoint", sNo)
	row("recorded step, checkpoint after it (answer)", sCk)
	row("baseline: plain exec right after a step", nNo)
	row("plain exec right after a checkpointed step", nCk)
	sr, sc := summarize(restore), summarize(create)
	row("baseline: create from layers", sc)
	row("restore from the checkpoint", sr)
	fmt.Fprintf(w, "\ncheckpointed step answer p50 / recorded step p50: %.2f×\n", float64(sCk.p50)/float64(sNo.p50))
	fmt.Fprintf(w, "step + next exec with a checkpoint, p50: %s against %s without (+%s, the checkpoint on the critical path of a trainer that does not think)\n",
		ms(sCk.p50+nCk.p50), ms(sNo.p50+nNo.p50), ms(sCk.p50+nCk.p50-sNo.p50-nNo.p50))
	fmt.Fprintf(w, "restore p50 / create p50: %.2f×\n", float64(sr.p50)/float64(sc.p50))
	return nil
}
