package bench

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"io"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// FullVMConfig sets up `dsec bench fullvm`: a full VM (its own kernel and
// systemd, with a screen) against a microVM and a container with the
// desktop toolkit (a screen served by its X server), through the same API
// in the same run. Memory is read from /proc, so it runs on the server's
// machine.
type FullVMConfig struct {
	Client *client.Client
	// VMLayer is the fullvm sandboxes' vm layer; Base the microVM's and
	// the container's base; Desktop the container's desktop toolkit
	// ("" leaves the container's screen out).
	VMLayer, Base, Desktop string
	// Cycles is how many create → first exec (→ first screenshot) →
	// destroy cycles each backend runs, one at a time.
	Cycles int
	// RoundTrips is how many screenshots and inputs are timed on each
	// backend with a screen.
	RoundTrips int
	// Idle is how many sandboxes of each backend are kept idle while
	// memory is measured.
	Idle int
	// VMMemoryMB is the fullvm's RAM; the others get MemoryMB.
	VMMemoryMB, MemoryMB int64
	// ScreenTimeout bounds the wait for a screen that is not blank.
	ScreenTimeout time.Duration
	Out           io.Writer
}

type screenFigures struct {
	firstExec, firstScreen, destroy stats
	screenshot, input               stats
	hasScreen                       bool
	pss, rss                        int64
	accel                           string
}

// FullVM runs the full VM benchmark and prints its report.
func FullVM(ctx context.Context, cfg FullVMConfig) error {
	w := cfg.Out
	fmt.Fprintf(w, "dsec bench fullvm: vm layer %s, base %s, desktop toolkit %q; %d cycles, %d screen round trips, %d idle sandboxes per backend\n\n",
		cfg.VMLayer, cfg.Base, cfg.Desktop, cfg.Cycles, cfg.RoundTrips, cfg.Idle)
	type run struct {
		name string
		req  api.CreateSandboxRequest
	}
	runs := []run{
		{"fullvm", api.CreateSandboxRequest{Backend: api.BackendFullVM, Layers: &api.LayerRefs{Base: cfg.VMLayer},
			Resources: api.Resources{CPU: 1, MemoryMB: cfg.VMMemoryMB}}},
		{"microvm", api.CreateSandboxRequest{Backend: api.BackendMicroVM, Layers: &api.LayerRefs{Base: cfg.Base},
			Resources: api.Resources{CPU: 1, MemoryMB: cfg.MemoryMB}}},
		{"container", api.CreateSandboxRequest{Backend: api.BackendContainer, Layers: &api.LayerRefs{Base: cfg.Base, Toolkit: cfg.Desktop},
			Resources: api.Resources{CPU: 1, MemoryMB: cfg.MemoryMB}}},
	}
	figs := make([]screenFigures, len(runs))
	for i, r := range runs {
		fmt.Fprintf(w, "running %s ...\n", r.name)
		f, err := measureScreen(ctx, cfg, r.req)
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		figs[i] = f
	}
	fmt.Fprintf(w, "\nfullvm accelerator: %s\n\n", figs[0].accel)
	fmt.Fprintf(w, "%-34s %14s %14s %14s\n", "measure", "fullvm", "microvm", "container")
	row := func(name string, get func(screenFigures) string) {
		fmt.Fprintf(w, "%-34s", name)
		for _, f := range figs {
			fmt.Fprintf(w, " %14s", get(f))
		}
		fmt.Fprintln(w)
	}
	screenOnly := func(f screenFigures, d time.Duration) string {
		if !f.hasScreen {
			return "no screen"
		}
		return ms(d)
	}
	row("create→first exec p50", func(f screenFigures) string { return ms(f.firstExec.p50) })
	row("create→first screenshot p50", func(f screenFigures) string { return screenOnly(f, f.firstScreen.p50) })
	row("destroy p50", func(f screenFigures) string { return ms(f.destroy.p50) })
	row("screenshot round trip p50", func(f screenFigures) string { return screenOnly(f, f.screenshot.p50) })
	row("input round trip p50 (a move)", func(f screenFigures) string { return screenOnly(f, f.input.p50) })
	row("idle memory per sandbox (PSS)", func(f screenFigures) string { return fmt.Sprintf("%.1fMB", float64(f.pss)/1024) })
	row("idle memory per sandbox (RSS)", func(f screenFigures) string { return fmt.Sprintf("%.1fMB", float64(f.rss)/1024) })
	return nil
}

// notBlank reports whether a PNG has at least two colours.
func notBlank(b []byte) bool {
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		return false
	}
	r := img.Bounds()
	r0, g0, b0, _ := img.At(r.Min.X, r.Min.Y).RGBA()
	for y := r.Min.Y; y < r.Max.Y; y += 2 {
		for x := r.Min.X; x < r.Max.X; x += 2 {
			if cr, cg, cb, _ := img.At(x, y).RGBA(); cr != r0 || cg != g0 || cb != b0 {
				return true
			}
		}
	}
	return false
}

func measureScreen(ctx context.Context, cfg FullVMConfig, req api.CreateSandboxRequest) (screenFigures, error) {
	c := cfg.Client
	f := screenFigures{hasScreen: req.Backend == api.BackendFullVM || (req.Backend == api.BackendContainer && cfg.Desktop != "")}
	var firsts, screens, destroys []time.Duration
	var keep *api.Sandbox
	for i := range cfg.Cycles {
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, &req)
		if err != nil {
			return f, err
		}
		_, err = c.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"true"}})
		firsts = append(firsts, time.Since(t0))
		if err == nil && f.hasScreen {
			deadline := time.Now().Add(cfg.ScreenTimeout)
			for {
				b, serr := c.Screenshot(ctx, sb.ID)
				if serr == nil && notBlank(b) {
					break
				}
				if time.Now().After(deadline) {
					err = fmt.Errorf("no screen that is not blank within %s (last error: %v)", cfg.ScreenTimeout, serr)
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			screens = append(screens, time.Since(t0))
		}
		if err == nil && i == cfg.Cycles-1 {
			keep = sb // the round trips run on the last one
			break
		}
		t1 := time.Now()
		if derr := c.DeleteSandbox(ctx, sb.ID); err == nil {
			err = derr
		}
		destroys = append(destroys, time.Since(t1))
		if err != nil {
			return f, err
		}
	}
	f.firstExec, f.firstScreen = summarize(firsts), summarize(screens)
	if keep != nil && f.hasScreen {
		var shots, inputs []time.Duration
		for i := range cfg.RoundTrips {
			t0 := time.Now()
			if _, err := c.Screenshot(ctx, keep.ID); err != nil {
				return f, err
			}
			shots = append(shots, time.Since(t0))
			t0 = time.Now()
			if _, err := c.Input(ctx, keep.ID, client.Move(10+i%100, 10+i%100)); err != nil {
				return f, err
			}
			inputs = append(inputs, time.Since(t0))
		}
		f.screenshot, f.input = summarize(shots), summarize(inputs)
	}
	if keep != nil {
		t1 := time.Now()
		if err := c.DeleteSandbox(ctx, keep.ID); err != nil {
			return f, err
		}
		destroys = append(destroys, time.Since(t1))
	}
	f.destroy = summarize(destroys)

	var ids []string
	defer func() {
		for _, id := range ids {
			c.DeleteSandbox(context.WithoutCancel(ctx), id)
		}
	}()
	for range cfg.Idle {
		sb, err := c.CreateSandbox(ctx, &req)
		if err != nil {
			return f, err
		}
		ids = append(ids, sb.ID)
		if _, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return f, err
		}
	}
	time.Sleep(5 * time.Second) // let boots (and desktops) settle into idleness
	var pss, rss int64
	for _, id := range ids {
		pids := sandboxPids(id)
		if len(pids) == 0 {
			return f, fmt.Errorf("no host process found for sandbox %s (run the benchmark on the server's machine)", id)
		}
		for _, pid := range pids {
			p, r := processMemKB(pid)
			pss, rss = pss+p, rss+r
			if a := accelOf(pid); a != "" {
				f.accel = a
			}
		}
	}
	n := int64(max(1, len(ids)))
	f.pss, f.rss = pss/n, rss/n
	return f, nil
}
