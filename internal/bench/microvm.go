package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// MicroVMConfig sets up `dsec bench microvm`: microVM sandboxes against
// container sandboxes from the same layers, through the same API, in the
// same run. Memory is read from /proc, so it runs on the server's machine.
type MicroVMConfig struct {
	Client *client.Client
	Base   string
	// Cycles is how many create → first exec → destroy cycles each
	// backend runs, one at a time.
	Cycles int
	// Idle is how many sandboxes of each backend are kept idle while
	// memory is measured.
	Idle      int
	Resources api.Resources
	Out       io.Writer
}

type backendFigures struct {
	firstExec, destroy stats
	pss, rss           int64 // per idle sandbox, kB
	accel              string
}

// MicroVM runs the microVM benchmark and prints its report.
func MicroVM(ctx context.Context, cfg MicroVMConfig) error {
	w := cfg.Out
	fmt.Fprintf(w, "dsec bench microvm: base %s, %d create→exec→destroy cycles and %d idle sandboxes per backend, cpu %.1f, memory %d MB\n\n",
		cfg.Base, cfg.Cycles, cfg.Idle, cfg.Resources.CPU, cfg.Resources.MemoryMB)
	var figs [2]backendFigures
	for i, backend := range []string{api.BackendMicroVM, api.BackendContainer} {
		f, err := measureBackend(ctx, cfg, backend)
		if err != nil {
			return fmt.Errorf("%s: %w", backend, err)
		}
		figs[i] = f
	}
	vm, ct := figs[0], figs[1]
	fmt.Fprintf(w, "microvm accelerator: %s\n\n", vm.accel)
	fmt.Fprintf(w, "%-40s %12s %12s %10s\n", "measure", "microvm", "container", "ratio")
	dur := func(name string, a, b time.Duration) {
		fmt.Fprintf(w, "%-40s %12s %12s %9.1f×\n", name, ms(a), ms(b), float64(a)/float64(max(b, 1)))
	}
	mem := func(name string, a, b int64) {
		fmt.Fprintf(w, "%-40s %10.1fMB %10.1fMB %9.1f×\n", name, float64(a)/1024, float64(b)/1024, float64(a)/float64(max(b, 1)))
	}
	dur("create→first exec p50", vm.firstExec.p50, ct.firstExec.p50)
	dur("create→first exec p99", vm.firstExec.p99, ct.firstExec.p99)
	dur("destroy p50", vm.destroy.p50, ct.destroy.p50)
	mem("idle memory per sandbox (PSS)", vm.pss, ct.pss)
	mem("idle memory per sandbox (RSS)", vm.rss, ct.rss)
	return nil
}

func measureBackend(ctx context.Context, cfg MicroVMConfig, backend string) (backendFigures, error) {
	var f backendFigures
	create := func() (*api.Sandbox, error) {
		return cfg.Client.CreateSandbox(ctx, &api.CreateSandboxRequest{
			Backend: backend, Layers: &api.LayerRefs{Base: cfg.Base}, Resources: cfg.Resources,
		})
	}
	var firsts, destroys []time.Duration
	for range cfg.Cycles {
		t0 := time.Now()
		sb, err := create()
		if err != nil {
			return f, err
		}
		_, err = cfg.Client.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"true"}})
		firsts = append(firsts, time.Since(t0))
		t1 := time.Now()
		if derr := cfg.Client.DeleteSandbox(ctx, sb.ID); err == nil {
			err = derr
		}
		destroys = append(destroys, time.Since(t1))
		if err != nil {
			return f, err
		}
	}
	f.firstExec, f.destroy = summarize(firsts), summarize(destroys)

	var ids []string
	defer func() {
		for _, id := range ids {
			cfg.Client.DeleteSandbox(context.WithoutCancel(ctx), id)
		}
	}()
	for range cfg.Idle {
		sb, err := create()
		if err != nil {
			return f, err
		}
		ids = append(ids, sb.ID)
		if _, err := cfg.Client.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return f, err
		}
	}
	time.Sleep(3 * time.Second) // let boots settle into idleness
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

// sandboxPids finds a sandbox's host processes: its VMM (named
// guest=dsec-<id>) or every process of its container (whose environment
// holds DSEC_SANDBOX_ID=<id>).
func sandboxPids(id string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	vmName := []byte("guest=dsec-" + id + "\x00")
	envVar := []byte("DSEC_SANDBOX_ID=" + id + "\x00")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && bytes.Contains(cmd, vmName) {
			out = append(out, pid)
			continue
		}
		if env, err := os.ReadFile("/proc/" + e.Name() + "/environ"); err == nil && bytes.Contains(env, envVar) {
			out = append(out, pid)
		}
	}
	return out
}

// processMemKB is a process's proportional and resident set size.
func processMemKB(pid int) (pss, rss int64) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Pss:":
			pss = v
		case "Rss:":
			rss = v
		}
	}
	return pss, rss
}

func accelOf(pid int) string {
	cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	for _, a := range []string{"kvm", "tcg"} {
		if bytes.Contains(cmd, []byte("\x00-accel\x00"+a)) {
			return a
		}
	}
	return ""
}
