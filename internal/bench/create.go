// Package bench measures dsec against baselines measured in the same run:
// sandbox creation through the real API against bare `runc run` of the same
// root filesystem. It prints figures; it never asserts on them.
package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/mount"
)

// CreateConfig sets up `dsec bench create`.
type CreateConfig struct {
	Client *client.Client
	Base   string // layer ref to create sandboxes from
	// Sequential is how many create→exec→destroy cycles run one by one;
	// Parallel cycles run Concurrency at a time.
	Sequential, Parallel, Concurrency int
	// Warmup is how many untimed cycles (8 at a time) run first: a node's
	// blank pool follows the creates of its last minute, so a node fresh
	// from rest holds only its minimum.
	Warmup int
	// Execs is how many warm exec round trips to time.
	Execs int
	// Baseline runs bare `runc run` on a busybox rootfs in WorkDir.
	Baseline bool
	WorkDir  string
	Runc     string
	// Network is the sandboxes' network mode ("" is none).
	Network string
	Out     io.Writer
}

// Create runs the create benchmark and prints its report.
func Create(ctx context.Context, cfg CreateConfig) error {
	w := cfg.Out
	fmt.Fprintf(w, "dsec bench create: base %s, network %s, %d sequential, %d parallel (%d at a time), %d warm execs\n\n",
		cfg.Base, cmp.Or(cfg.Network, api.NetworkNone), cfg.Sequential, cfg.Parallel, cfg.Concurrency, cfg.Execs)

	if cfg.Warmup > 0 {
		fmt.Fprintf(w, "warm-up: %d untimed cycles, 8 at a time (the node's blank pool follows demand)\n", cfg.Warmup)
		if _, err := cycles(ctx, cfg, cfg.Warmup, 8); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	warmPool(ctx, cfg.Client, w)
	seq, err := cycles(ctx, cfg, cfg.Sequential, 1)
	if err != nil {
		return err
	}
	warmPool(ctx, cfg.Client, w)
	par, err := cycles(ctx, cfg, cfg.Parallel, cfg.Concurrency)
	if err != nil {
		return err
	}
	if nl, err := cfg.Client.NodeList(ctx); err == nil {
		for _, n := range nl.Nodes {
			if p := n.Load.BlankPool; p != nil {
				fmt.Fprintf(w, "node %s blank sandbox pool: %d ready, target %d, max %d; %d creates claimed, %d missed (as of its last heartbeat)\n\n",
					n.ID, p.Size, p.Target, p.Max, p.Claims, p.Misses)
			}
		}
	}
	// The refill the burst set going is background work (idle CPU only);
	// the warm execs and the baselines are timed on a node at rest.
	warmPool(ctx, cfg.Client, w)
	warm, err := warmExecs(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%-44s %10s %10s %12s\n", "measure", "p50", "p99", "rate")
	row := func(name string, s stats, rate string) {
		fmt.Fprintf(w, "%-44s %10s %10s %12s\n", name, ms(s.p50), ms(s.p99), rate)
	}
	row("dsec create→first exec (sequential)", seq.firstExec, "")
	row("dsec create→exec→destroy (sequential)", seq.cycle, perSec(seq.n, seq.wall))
	row(fmt.Sprintf("dsec create→exec→destroy (%d parallel)", cfg.Concurrency), par.cycle, perSec(par.n, par.wall))
	row("dsec warm exec round trip (`true`)", warm, "")

	if !cfg.Baseline {
		return nil
	}
	warmPool(ctx, cfg.Client, w)
	bseq, bwall, err := runcBaseline(ctx, cfg.WorkDir, cfg.Runc, cfg.Sequential, 1)
	if err != nil {
		return fmt.Errorf("runc baseline: %w", err)
	}
	bpar, bpwall, err := runcBaseline(ctx, cfg.WorkDir, cfg.Runc, cfg.Parallel, cfg.Concurrency)
	if err != nil {
		return fmt.Errorf("runc baseline: %w", err)
	}
	row("baseline: bare `runc run` true (sequential)", bseq, perSec(cfg.Sequential, bwall))
	row(fmt.Sprintf("baseline: bare `runc run` true (%d parallel)", cfg.Concurrency), bpar, perSec(cfg.Parallel, bpwall))
	fe, err := forkExecBaseline(ctx, cfg.Execs)
	if err != nil {
		return fmt.Errorf("fork+exec baseline: %w", err)
	}
	row("baseline: fork+exec busybox `true` from Go", fe, "")
	fmt.Fprintf(w, "\ncreate→first exec p50 / runc run p50: %.2f×\n", float64(seq.firstExec.p50)/float64(bseq.p50))
	fmt.Fprintf(w, "warm exec p50 / fork+exec p50: %.2f×\n", float64(warm.p50)/float64(fe.p50))
	fmt.Fprintf(w, "parallel sandboxes/s vs runc runs/s: %.2f×\n",
		(float64(par.n)/par.wall.Seconds())/(float64(cfg.Parallel)/bpwall.Seconds()))
	return nil
}

// warmPool waits (up to 30 s) until every node's blank sandbox pool is at
// its target, as a heartbeat made after the call reports it: a node that
// saw demand a moment ago. Without a pool it returns at once.
func warmPool(ctx context.Context, c *client.Client, w io.Writer) {
	since := time.Now()
	deadline := since.Add(30 * time.Second)
	for {
		nl, err := c.NodeList(ctx)
		if err != nil {
			return
		}
		cold := ""
		for _, n := range nl.Nodes {
			// Only a report made after the run before it counts: an older
			// heartbeat shows the pool full while the run drained it.
			if !n.LastSeen.IsZero() && n.LastSeen.Before(since) {
				cold = fmt.Sprintf("node %s's report (last seen %s)", n.ID, n.LastSeen.Format(time.TimeOnly))
				continue
			}
			if p := n.Load.BlankPool; p != nil && p.Size < p.Target {
				cold = fmt.Sprintf("node %s's pool %d/%d", n.ID, p.Size, p.Target)
			}
		}
		if cold == "" {
			return
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(w, "(went on with %s after 30s)\n", cold)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

type stats struct{ p50, p99 time.Duration }

func summarize(d []time.Duration) stats {
	if len(d) == 0 {
		return stats{}
	}
	slices.Sort(d)
	pct := func(p float64) time.Duration { return d[min(len(d)-1, int(float64(len(d))*p))] }
	return stats{p50: pct(0.50), p99: pct(0.99)}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

func perSec(n int, wall time.Duration) string {
	return fmt.Sprintf("%.1f/s", float64(n)/wall.Seconds())
}

type cycleResult struct {
	n                int
	wall             time.Duration
	firstExec, cycle stats
}

// cycles runs n create → exec `true` → destroy cycles, conc at a time.
func cycles(ctx context.Context, cfg CreateConfig, n, conc int) (cycleResult, error) {
	var mu sync.Mutex
	var firsts, totals []time.Duration
	var firstErr error
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			sb, err := cfg.Client.CreateSandbox(ctx, &api.CreateSandboxRequest{
				Layers: &api.LayerRefs{Base: cfg.Base}, Resources: api.Resources{CPU: 0.5, MemoryMB: 128},
				Network: &api.Network{Mode: cmp.Or(cfg.Network, api.NetworkNone)},
			})
			if err == nil {
				_, err = cfg.Client.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"true"}})
				first := time.Since(t0)
				if derr := cfg.Client.DeleteSandbox(ctx, sb.ID); err == nil {
					err = derr
				}
				mu.Lock()
				firsts, totals = append(firsts, first), append(totals, time.Since(t0))
				mu.Unlock()
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return cycleResult{}, firstErr
	}
	return cycleResult{n: n, wall: time.Since(start), firstExec: summarize(firsts), cycle: summarize(totals)}, nil
}

func warmExecs(ctx context.Context, cfg CreateConfig) (stats, error) {
	sb, err := cfg.Client.CreateSandbox(ctx, &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: cfg.Base}})
	if err != nil {
		return stats{}, err
	}
	defer cfg.Client.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	var d []time.Duration
	for range cfg.Execs {
		t0 := time.Now()
		if _, err := cfg.Client.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return stats{}, err
		}
		d = append(d, time.Since(t0))
	}
	return summarize(d), nil
}

// forkExecBaseline times n fork+execs of the static busybox base:minimal
// is made from, running `true` on the host: the least a warm exec costs.
func forkExecBaseline(ctx context.Context, n int) (stats, error) {
	var d []time.Duration
	for range max(n, 1) {
		t0 := time.Now()
		if out, err := exec.CommandContext(ctx, "/bin/busybox", "true").CombinedOutput(); err != nil {
			return stats{}, fmt.Errorf("busybox true: %v: %s", err, out)
		}
		d = append(d, time.Since(t0))
	}
	return summarize(d), nil
}

// runcBaseline runs `runc run` of `true` n times, conc at a time, each on
// a fresh overlay over the same busybox EROFS layer dsec's base:minimal is
// made from. Only the `runc run` is timed.
func runcBaseline(ctx context.Context, workDir, runc string, n, conc int) (stats, time.Duration, error) {
	dir, err := os.MkdirTemp(workDir, "runc-baseline-")
	if err != nil {
		return stats{}, 0, err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return stats{}, 0, err
	}
	if err := layer.MinimalBase(ctx, "/bin/busybox", src); err != nil {
		return stats{}, 0, err
	}
	if _, err := layer.Build(ctx, src, filepath.Join(dir, "base.erofs")); err != nil {
		return stats{}, 0, err
	}
	lower := filepath.Join(dir, "lower")
	os.Mkdir(lower, 0o755)
	if err := mount.EROFS(filepath.Join(dir, "base.erofs"), lower); err != nil {
		return stats{}, 0, err
	}
	defer mount.Unmount(lower)

	var mu sync.Mutex
	var times []time.Duration
	var firstErr error
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			d, err := runcOnce(ctx, runc, filepath.Join(dir, fmt.Sprint(i)), lower)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			times = append(times, d)
		}()
	}
	wg.Wait()
	return summarize(times), time.Since(start), firstErr
}

func runcOnce(ctx context.Context, runc, dir, lower string) (time.Duration, error) {
	for _, d := range []string{"upper", "work", "rootfs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return 0, err
		}
	}
	rootfs := filepath.Join(dir, "rootfs")
	if err := mount.Overlay([]string{lower}, filepath.Join(dir, "upper"), filepath.Join(dir, "work"), rootfs); err != nil {
		return 0, err
	}
	defer mount.Unmount(rootfs)
	spec := exec.CommandContext(ctx, runc, "spec", "--bundle", dir)
	if out, err := spec.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("runc spec: %v: %s", err, out)
	}
	if err := patchSpec(filepath.Join(dir, "config.json"), rootfs); err != nil {
		return 0, err
	}
	id := "bench-" + filepath.Base(filepath.Dir(dir)) + "-" + filepath.Base(dir)
	t0 := time.Now()
	out, err := exec.CommandContext(ctx, runc, "--root", filepath.Join(filepath.Dir(dir), "runc"), "run", "--bundle", dir, id).CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("runc run: %v: %s", err, out)
	}
	return d, nil
}

// patchSpec turns `runc spec`'s default into a non-interactive run of
// `true` on rootfs.
func patchSpec(path, rootfs string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	s.Root = &specs.Root{Path: rootfs}
	s.Process.Terminal = false
	s.Process.Args = []string{"true"}
	b, err = json.Marshal(&s)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
