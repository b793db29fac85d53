package bench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// ResetConfig sets up `dsec bench reset`.
type ResetConfig struct {
	Client *client.Client
	Base   string
	// Rounds is how many episodes each measure runs; Concurrency
	// sandboxes run them at a time in the parallel measures.
	Rounds, Concurrency int
	Out                 io.Writer
}

// dirtyEpisode is what an episode leaves behind before its reset: files,
// a background process, a file in /dev/shm.
const dirtyEpisode = "echo x > /tmp/f; echo y > /dev/shm/g; sleep 1000 >/dev/null 2>&1 &"

// Reset measures reset → first exec against its baseline, destroy +
// create → first exec, in the same run: sequentially (the two
// alternating on one sandbox each, so both see the same load) and with
// Concurrency sandboxes at a time.
func Reset(ctx context.Context, cfg ResetConfig) error {
	w := cfg.Out
	fmt.Fprintf(w, "dsec bench reset: base %s, %d episodes per measure, %d at a time in parallel\n\n", cfg.Base, cfg.Rounds, cfg.Concurrency)
	req := &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: cfg.Base}, Resources: api.Resources{CPU: 0.5, MemoryMB: 128},
		Network: &api.Network{Mode: api.NetworkNone}}
	// One worker's episodes: reset (or recreate) → first exec, each after
	// dirtying the sandbox.
	episodes := func(ctx context.Context, n int, recreate bool, out chan<- time.Duration) error {
		sb, err := cfg.Client.CreateSandbox(ctx, req)
		if err != nil {
			return err
		}
		id := sb.ID
		defer func() { cfg.Client.DeleteSandbox(context.WithoutCancel(ctx), id) }()
		for range n {
			if _, err := cfg.Client.Exec(ctx, id, &api.ExecRequest{Shell: dirtyEpisode}); err != nil {
				return err
			}
			t0 := time.Now()
			if recreate {
				if err := cfg.Client.DeleteSandbox(ctx, id); err != nil {
					return err
				}
				sb, err := cfg.Client.CreateSandbox(ctx, req)
				if err != nil {
					return err
				}
				id = sb.ID
			} else if _, err := cfg.Client.Reset(ctx, id); err != nil {
				return err
			}
			if _, err := cfg.Client.Exec(ctx, id, &api.ExecRequest{Cmd: []string{"true"}}); err != nil {
				return err
			}
			out <- time.Since(t0)
		}
		return nil
	}
	measure := func(workers, each int, recreate bool) (stats, time.Duration, error) {
		out := make(chan time.Duration, workers*each)
		errs := make(chan error, workers)
		var wg sync.WaitGroup
		t0 := time.Now()
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- episodes(ctx, each, recreate, out)
			}()
		}
		wg.Wait()
		wall := time.Since(t0)
		close(out)
		close(errs)
		for err := range errs {
			if err != nil {
				return stats{}, 0, err
			}
		}
		var d []time.Duration
		for x := range out {
			d = append(d, x)
		}
		return summarize(d), wall, nil
	}
	// Sequential: one episode of each kind in turn.
	var resets, recreates []time.Duration
	for range cfg.Rounds {
		for _, recreate := range []bool{false, true} {
			s, _, err := measure(1, 1, recreate)
			if err != nil {
				return err
			}
			if recreate {
				recreates = append(recreates, s.p50)
			} else {
				resets = append(resets, s.p50)
			}
		}
	}
	seqReset, seqRecreate := summarize(resets), summarize(recreates)
	each := max(1, cfg.Rounds/cfg.Concurrency*4)
	parReset, parResetWall, err := measure(cfg.Concurrency, each, false)
	if err != nil {
		return err
	}
	parRecreate, parRecreateWall, err := measure(cfg.Concurrency, each, true)
	if err != nil {
		return err
	}
	n := cfg.Concurrency * each
	fmt.Fprintf(w, "%-52s %10s %10s %12s\n", "measure", "p50", "p99", "rate")
	row := func(name string, s stats, rate string) {
		fmt.Fprintf(w, "%-52s %10s %10s %12s\n", name, ms(s.p50), ms(s.p99), rate)
	}
	row("reset → first exec (sequential)", seqReset, "")
	row("baseline: destroy + create → first exec (sequential)", seqRecreate, "")
	row(fmt.Sprintf("reset → first exec (%d parallel)", cfg.Concurrency), parReset, perSec(n, parResetWall))
	row(fmt.Sprintf("baseline: destroy + create → first exec (%d par.)", cfg.Concurrency), parRecreate, perSec(n, parRecreateWall))
	fmt.Fprintf(w, "\nsequential p50: reset is %.1f× faster than destroy + create\n", float64(seqRecreate.p50)/float64(seqReset.p50))
	fmt.Fprintf(w, "parallel episodes/s: reset %.1f× destroy + create\n", parRecreateWall.Seconds()/parResetWall.Seconds())
	return nil
}
