package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// BatchConfig sets up `dsec bench batch`.
type BatchConfig struct {
	Client *client.Client
	Base   string
	// Count sandboxes in one batch; Baseline sandboxes by single creates,
	// Concurrency at a time, as a client without batches would.
	Count, Baseline, Concurrency int
	MemoryMB                     int64
	Out                          io.Writer
}

// Batch times one batch create to all-ready against single creates
// measured in the same run, and destroys everything it made.
func Batch(ctx context.Context, cfg BatchConfig) error {
	w := cfg.Out
	spec := api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: cfg.Base},
		Resources: api.Resources{CPU: 0.05, MemoryMB: cfg.MemoryMB, Pids: 64}, Labels: map[string]string{"bench": "batch"}}
	fmt.Fprintf(w, "dsec bench batch: %d sandboxes of %s with %d MB in one batch; baseline %d single creates, %d at a time\n\n",
		cfg.Count, cfg.Base, cfg.MemoryMB, cfg.Baseline, cfg.Concurrency)

	start := time.Now()
	var marks []string
	next := 0
	quarters := []int{cfg.Count / 4, cfg.Count / 2, cfg.Count * 3 / 4}
	res, err := cfg.Client.CreateBatch(ctx, &api.BatchCreateRequest{Count: cfg.Count, CreateSandboxRequest: spec},
		func(p api.BatchProgress) {
			for next < len(quarters) && p.Created >= quarters[next] && quarters[next] > 0 {
				marks = append(marks, fmt.Sprintf("%d%% ready at %.1fs", (next+1)*25, time.Since(start).Seconds()))
				next++
			}
		})
	if err != nil {
		return err
	}
	wall := time.Since(start)
	var ids []string
	for _, it := range res.Items {
		if it.Error == nil {
			ids = append(ids, it.ID)
		}
	}
	// Ready means usable: the last one built answers a command.
	if len(ids) > 0 {
		if _, err := cfg.Client.Exec(ctx, ids[len(ids)-1], &api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return fmt.Errorf("exec in the last sandbox of the batch: %w", err)
		}
	}
	fmt.Fprintf(w, "batch of %d: %d ready, %d failed; all ready in %.1fs (%.1f sandboxes/s); %v\n",
		cfg.Count, res.Created, res.Failed, wall.Seconds(), float64(res.Created)/wall.Seconds(), marks)
	for _, it := range res.Items {
		if it.Error != nil {
			fmt.Fprintf(w, "  first failure: %s (%s)\n", it.Error.Message, it.Error.Code)
			break
		}
	}
	dstart := time.Now()
	todo := make(chan string, len(ids))
	for _, id := range ids {
		todo <- id
	}
	_, _, derr := timeMany(len(ids), 32, func() error { return cfg.Client.DeleteSandbox(ctx, <-todo) })
	fmt.Fprintf(w, "destroyed them in %.1fs\n", time.Since(dstart).Seconds())
	if derr != nil {
		return derr
	}

	if cfg.Baseline > 0 {
		made := make(chan string, cfg.Baseline)
		bstart := time.Now()
		_, _, err := timeMany(cfg.Baseline, cfg.Concurrency, func() error {
			sb, err := cfg.Client.CreateSandbox(ctx, &spec)
			if err == nil {
				made <- sb.ID
			}
			return err
		})
		bwall := time.Since(bstart)
		close(made)
		for id := range made {
			cfg.Client.DeleteSandbox(ctx, id)
		}
		if err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		fmt.Fprintf(w, "baseline: %d single creates, %d at a time: %.1fs (%.1f sandboxes/s)\n",
			cfg.Baseline, cfg.Concurrency, bwall.Seconds(), float64(cfg.Baseline)/bwall.Seconds())
		fmt.Fprintf(w, "batch sandboxes/s vs single creates: %.2f×\n",
			(float64(res.Created)/wall.Seconds())/(float64(cfg.Baseline)/bwall.Seconds()))
	}
	return nil
}
