package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// SoakConfig sets up `dsec bench soak`.
type SoakConfig struct {
	Client *client.Client
	Base   string
	// Sandboxes long-lived sandboxes get Workers exec loops each;
	// Churners loops create, exec, reset, exec and destroy beside them.
	Sandboxes, Workers, Churners int
	Duration                     time.Duration
	Out                          io.Writer
}

// soakLines is how many lines the checked commands print: more than a
// pipe holds, so that the command blocks on a slow reader.
const soakLines = 20000

// Soak loads one server with turns of exec (buffered and streamed) on
// long-lived sandboxes and with create/reset/destroy cycles, for a while,
// and checks every answer: exit code, and every byte of output. It
// reports what it did and every kind of failure it met; a failure is an
// error of the run. It measures correctness under load, not speed: the
// rates it prints are for the record.
func Soak(ctx context.Context, cfg SoakConfig) error {
	w := cfg.Out
	fmt.Fprintf(w, "dsec bench soak: %d sandboxes × %d exec loops, %d create/reset/destroy loops, %s, base %s\n\n",
		cfg.Sandboxes, cfg.Workers, cfg.Churners, cfg.Duration, cfg.Base)
	var want strings.Builder
	for i := 1; i <= soakLines; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	wantOut := want.String() + "done\n"
	req := &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: cfg.Base}, Resources: api.Resources{CPU: 0.5, MemoryMB: 64}}

	var mu sync.Mutex
	counts, failures := map[string]int{}, map[string]int{}
	var lat []time.Duration
	fail := func(what string, err error) {
		msg := err.Error()
		if len(msg) > 160 {
			msg = msg[:160] + "…"
		}
		mu.Lock()
		failures[what+": "+msg]++
		mu.Unlock()
	}
	done := func(what string, d time.Duration) {
		mu.Lock()
		counts[what]++
		if d > 0 {
			lat = append(lat, d)
		}
		mu.Unlock()
	}

	var ids []string
	defer func() {
		for _, id := range ids {
			cfg.Client.DeleteSandbox(context.WithoutCancel(ctx), id)
		}
	}()
	for range cfg.Sandboxes {
		sb, err := cfg.Client.CreateSandbox(ctx, req)
		if err != nil {
			return fmt.Errorf("soak: create: %w", err)
		}
		ids = append(ids, sb.ID)
	}
	cmd := fmt.Sprintf("seq 1 %d; echo done", soakLines)
	check := func(res *api.ExecResult, out string) error {
		switch {
		case res == nil:
			return fmt.Errorf("no result")
		case res.ExitCode != 0 || res.TimedOut:
			return fmt.Errorf("exit %d, timed out %v", res.ExitCode, res.TimedOut)
		case out != wantOut:
			return fmt.Errorf("output of %d bytes differs from the %d expected (ends %q)", len(out), len(wantOut), out[max(0, len(out)-20):])
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var wg sync.WaitGroup
	for _, id := range ids {
		for range cfg.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					t0 := time.Now()
					res, err := cfg.Client.Exec(ctx, id, &api.ExecRequest{Shell: cmd})
					if ctx.Err() != nil {
						return
					}
					if err == nil {
						err = check(res, res.Stdout)
					}
					if err != nil {
						fail("exec", err)
					} else {
						done("exec", time.Since(t0))
					}
					var out strings.Builder
					res, err = cfg.Client.ExecStream(ctx, id, &api.ExecRequest{Shell: cmd}, func(ev api.ExecEvent) error {
						if ev.Stdout != nil {
							out.WriteString(*ev.Stdout)
						}
						return nil
					})
					if ctx.Err() != nil {
						return
					}
					if err == nil {
						err = check(res, out.String())
					}
					if err != nil {
						fail("exec stream", err)
					} else {
						done("exec stream", 0)
					}
				}
			}()
		}
	}
	for range cfg.Churners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := churn(ctx, cfg.Client, req); err != nil && ctx.Err() == nil {
					fail("create/reset/destroy", err)
				} else if err == nil {
					done("create/reset/destroy", 0)
				}
			}
		}()
	}
	wg.Wait()

	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	for _, what := range []string{"exec", "exec stream", "create/reset/destroy"} {
		fmt.Fprintf(w, "%-22s %7d ok  %5.1f/s\n", what, counts[what], float64(counts[what])/cfg.Duration.Seconds())
	}
	if len(lat) > 0 {
		fmt.Fprintf(w, "buffered exec of %d lines: p50 %s, p99 %s\n", soakLines,
			lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*99/100].Round(time.Millisecond))
	}
	if len(failures) == 0 {
		fmt.Fprintln(w, "failures: none")
		return nil
	}
	n := 0
	fmt.Fprintln(w, "failures:")
	for msg, k := range failures {
		fmt.Fprintf(w, "  %5d × %s\n", k, msg)
		n += k
	}
	return fmt.Errorf("soak: %d failures", n)
}

// churn is one create → exec → reset → exec → destroy cycle, checked.
func churn(ctx context.Context, c *client.Client, req *api.CreateSandboxRequest) error {
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "echo dirty > /tmp/f; cat /tmp/f"})
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if res.Stdout != "dirty\n" {
		return fmt.Errorf("exec: stdout %q", res.Stdout)
	}
	if _, err := c.Reset(ctx, sb.ID); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	res, err = c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "test -e /tmp/f && echo still there || echo clean"})
	if err != nil {
		return fmt.Errorf("exec after reset: %w", err)
	}
	if res.Stdout != "clean\n" {
		return fmt.Errorf("after reset: %q", res.Stdout)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	return nil
}
