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

// FnCallConfig sets up `dsec bench fncall`.
type FnCallConfig struct {
	Client *client.Client
	Base   string
	// Python also times `python3 -c` (the base must have python3).
	Python bool
	// Calls FnCalls per command, Concurrency at a time; Baseline
	// create→exec→destroy cycles per command at the same concurrency.
	Calls, Baseline, Concurrency int
	// Rate, if set, also sends Calls calls at this many per second (open
	// loop): latency at a load the node sustains, where a closed loop
	// measures the saturated throughput.
	Rate     float64
	MemoryMB int64
	Out      io.Writer
}

// FnCall times short calls on the warm pool against the same command run
// by creating a container sandbox per call, in the same run.
func FnCall(ctx context.Context, cfg FnCallConfig) error {
	w := cfg.Out
	cmds := [][]string{{"echo", "hi"}}
	if cfg.Python {
		cmds = append(cmds, []string{"python3", "-c", "print(1+1)"})
	}
	layers := &api.LayerRefs{Base: cfg.Base}
	res := api.Resources{MemoryMB: cfg.MemoryMB}
	fmt.Fprintf(w, "dsec bench fncall: base %s, %d calls and %d create-per-call baselines per command, %d at a time\n\n",
		cfg.Base, cfg.Calls, cfg.Baseline, cfg.Concurrency)
	if _, err := cfg.Client.WarmPool(ctx, &api.FnCallWarmRequest{Layers: layers, Resources: res, Size: cfg.Concurrency}); err != nil {
		return fmt.Errorf("warm the pool: %w", err)
	}
	fmt.Fprintf(w, "%-46s %9s %9s %11s\n", "measure", "p50", "p99", "calls/s")
	for _, cmd := range cmds {
		name := fmt.Sprintf("%q", cmd)
		call := func() error {
			r, err := cfg.Client.FnCall(ctx, &api.FnCallRequest{Layers: layers, Resources: res, Cmd: cmd})
			if err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("%v exited %d: %s", cmd, r.ExitCode, r.Stderr)
			}
			return err
		}
		// Warm up: let the pool reach its size for this concurrency.
		if _, _, err := timeMany(cfg.Concurrency*2, cfg.Concurrency, call); err != nil {
			return err
		}
		fs, fwall, err := timeMany(cfg.Calls, cfg.Concurrency, call)
		if err != nil {
			return err
		}
		cold := func() error {
			sb, err := cfg.Client.CreateSandbox(ctx, &api.CreateSandboxRequest{Layers: layers, Resources: res})
			if err != nil {
				return err
			}
			r, err := cfg.Client.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: cmd})
			if derr := cfg.Client.DeleteSandbox(ctx, sb.ID); err == nil {
				err = derr
			}
			if err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("%v exited %d", cmd, r.ExitCode)
			}
			return err
		}
		bs, bwall, err := timeMany(cfg.Baseline, cfg.Concurrency, cold)
		if err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		fmt.Fprintf(w, "%-46s %9s %9s %11s\n", "fncall "+name, ms(fs.p50), ms(fs.p99), perSec(cfg.Calls, fwall))
		if cfg.Rate > 0 {
			os, owall, err := openLoop(cfg.Calls, cfg.Rate, call)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%-46s %9s %9s %11s\n", fmt.Sprintf("fncall %s at %.0f/s", name, cfg.Rate), ms(os.p50), ms(os.p99),
				perSec(cfg.Calls, owall))
		}
		fmt.Fprintf(w, "%-46s %9s %9s %11s\n", "baseline: create→exec→destroy "+name, ms(bs.p50), ms(bs.p99), perSec(cfg.Baseline, bwall))
		fmt.Fprintf(w, "%-46s %8.1f× lower p50, %.1f× the calls/s\n", "", float64(bs.p50)/float64(fs.p50),
			(float64(cfg.Calls)/fwall.Seconds())/(float64(cfg.Baseline)/bwall.Seconds()))
	}
	return nil
}

// timeMany runs fn n times, conc at a time, and returns the latency
// percentiles and the wall time.
func timeMany(n, conc int, fn func() error) (stats, time.Duration, error) {
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	sem := make(chan struct{}, max(1, conc))
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			err := fn()
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			lat = append(lat, time.Since(t0))
		}()
	}
	wg.Wait()
	return summarize(lat), time.Since(start), firstErr
}

// openLoop starts n calls at rate per second, whatever the answers, and
// returns their latencies.
func openLoop(n int, rate float64, fn func() error) (stats, time.Duration, error) {
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	every := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			err := fn()
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			lat = append(lat, time.Since(t0))
		}()
	}
	wg.Wait()
	return summarize(lat), time.Since(start), firstErr
}
