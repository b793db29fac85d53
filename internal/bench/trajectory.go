package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// TrajectoryConfig sets up `dsec bench trajectory`.
type TrajectoryConfig struct {
	Client *client.Client
	Base   string
	// Steps is how many steps each measure times; Concurrency how many
	// sandboxes, each with its own trajectory, run at once in the
	// throughput measures.
	Steps, Concurrency int
	Out                io.Writer
}

// Trajectory times what the trajectory log costs: a step that runs and is
// recorded durably, and a step replayed from the log, against the same
// command run as a plain exec, in the same run; then steps per second with
// Concurrency trainers at once against plain execs at the same
// concurrency.
func Trajectory(ctx context.Context, cfg TrajectoryConfig) error {
	w := cfg.Out
	c := cfg.Client
	fmt.Fprintf(w, "dsec bench trajectory: base %s, %d steps per measure, %d at a time for throughput\n\n",
		cfg.Base, cfg.Steps, cfg.Concurrency)
	boxes := make([]*api.Sandbox, cfg.Concurrency+1) // 0 for latency, the rest for throughput
	for i := range boxes {
		sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: cfg.Base},
			Resources: api.Resources{CPU: 0.5, MemoryMB: 128}})
		if err != nil {
			return err
		}
		defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		boxes[i] = sb
	}
	prefix := fmt.Sprintf("bench-%08x", rand.Uint32())
	defer func() {
		for i := range boxes {
			c.DeleteTrajectory(context.WithoutCancel(ctx), fmt.Sprintf("%s-%d", prefix, i), 0)
		}
	}()
	const cmd = "echo step"
	// one runs cfg.Steps execs in sandbox i: plain, or steps of its
	// trajectory; it checks replays are replays and runs are not.
	one := func(i int, traj bool, wantReplayed bool) ([]time.Duration, error) {
		var d []time.Duration
		for s := range cfg.Steps {
			req := &api.ExecRequest{Shell: cmd}
			if traj {
				req.Trajectory = &api.Trajectory{ID: fmt.Sprintf("%s-%d", prefix, i), Step: int64(s)}
			}
			t0 := time.Now()
			res, err := c.Exec(ctx, boxes[i].ID, req)
			if err != nil {
				return nil, err
			}
			d = append(d, time.Since(t0))
			if res.Replayed != wantReplayed {
				return nil, fmt.Errorf("step %d of sandbox %d: replayed=%v", s, i, res.Replayed)
			}
		}
		return d, nil
	}
	plain, err := one(0, false, false)
	if err != nil {
		return err
	}
	recorded, err := one(0, true, false)
	if err != nil {
		return err
	}
	replayed, err := one(0, true, true)
	if err != nil {
		return err
	}
	// Throughput: trajectories 1.. are fresh; sandbox 0 replays.
	parallel := func(traj bool) (time.Duration, error) {
		var wg sync.WaitGroup
		errs := make(chan error, len(boxes))
		start := time.Now()
		for i := 1; i < len(boxes); i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := one(i, traj, false); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		return time.Since(start), <-errs
	}
	plainWall, err := parallel(false)
	if err != nil {
		return err
	}
	stepWall, err := parallel(true)
	if err != nil {
		return err
	}

	fmt.Fprintf(w, "%-48s %10s %10s\n", "measure", "p50", "p99")
	row := func(name string, s stats) { fmt.Fprintf(w, "%-48s %10s %10s\n", name, ms(s.p50), ms(s.p99)) }
	sp, sr, sy := summarize(plain), summarize(recorded), summarize(replayed)
	row("baseline: plain exec `"+cmd+"`", sp)
	row("trajectory step, run and recorded durably", sr)
	row("trajectory step, replayed from the log", sy)
	fmt.Fprintf(w, "\nrecorded step p50 / plain exec p50: %.2f×\n", float64(sr.p50)/float64(sp.p50))
	fmt.Fprintf(w, "replayed step p50 / plain exec p50: %.2f×\n", float64(sy.p50)/float64(sp.p50))
	if n := (len(boxes) - 1) * cfg.Steps; n > 0 {
		fmt.Fprintf(w, "%d at a time: plain execs %s, recorded steps %s (%.2f×)\n", len(boxes)-1,
			perSec(n, plainWall), perSec(n, stepWall), plainWall.Seconds()/stepWall.Seconds())
	}
	return nil
}
