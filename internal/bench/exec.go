package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/agent"
)

// ExecConfig sets up `dsec bench exec`.
type ExecConfig struct {
	Client *client.Client
	Base   string
	// N is how many warm execs each measure times.
	N int
	// CPU is the sandbox's cpu (a small one shows whether the agent's
	// serving is charged to the tenant's quota).
	CPU float64
	// DataDir is the all-in-one server's data directory, for the direct
	// agent call (its sandboxes' agent sockets); "" skips it.
	DataDir string
	Out     io.Writer
}

// Exec times warm exec round trips of `true` through the public HTTP API
// against, in the same run, a direct call to the sandbox's agent over its
// unix socket (what the server and edge add is the difference) and a
// fork+exec of /bin/true from Go (the least any exec costs).
func Exec(ctx context.Context, cfg ExecConfig) error {
	w := cfg.Out
	n := max(cfg.N, 1)
	fmt.Fprintf(w, "dsec bench exec: base %s, cpu %g, %d warm execs of `true` each\n\n", cfg.Base, cfg.CPU, n)
	sb, err := cfg.Client.CreateSandbox(ctx, &api.CreateSandboxRequest{
		Layers: &api.LayerRefs{Base: cfg.Base}, Resources: api.Resources{CPU: cfg.CPU, MemoryMB: 128},
	})
	if err != nil {
		return err
	}
	defer cfg.Client.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	req := &api.ExecRequest{Cmd: []string{"true"}}
	time1 := func(f func() error) ([]time.Duration, error) {
		// A few untimed rounds first: connections, caches, page faults.
		for range min(20, n) {
			if err := f(); err != nil {
				return nil, err
			}
		}
		d := make([]time.Duration, 0, n)
		for range n {
			t0 := time.Now()
			if err := f(); err != nil {
				return nil, err
			}
			d = append(d, time.Since(t0))
		}
		return d, nil
	}
	fmt.Fprintf(w, "%-48s %10s %10s\n", "measure", "p50", "p99")
	row := func(name string, d []time.Duration) stats {
		s := summarize(d)
		fmt.Fprintf(w, "%-48s %10s %10s\n", name, msFine(s.p50), msFine(s.p99))
		return s
	}
	apiTimes, err := time1(func() error {
		res, err := cfg.Client.Exec(ctx, sb.ID, req)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("exec through the API: %w", err)
	}
	viaAPI := row("dsec warm exec through the HTTP API", apiTimes)
	var direct stats
	if cfg.DataDir != "" {
		sock := filepath.Join(cfg.DataDir, "edge", "container", "sandboxes", sb.ID, "agent.sock")
		if _, err := os.Stat(sock); err != nil {
			fmt.Fprintf(w, "%-48s %s\n", "direct agent call", "skipped: "+err.Error())
		} else {
			ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			})
			defer ag.Close()
			d, err := time1(func() error { _, err := ag.Exec(ctx, req); return err })
			if err != nil {
				return fmt.Errorf("direct agent call: %w", err)
			}
			direct = row("baseline: direct agent call (unix socket)", d)
		}
	}
	fe, err := time1(func() error { return exec.CommandContext(ctx, "/bin/true").Run() })
	if err != nil {
		return fmt.Errorf("fork+exec baseline: %w", err)
	}
	fork := row("baseline: fork+exec /bin/true from Go", fe)
	fmt.Fprintf(w, "\nAPI exec p50 / fork+exec p50: %.2f×\n", float64(viaAPI.p50)/float64(fork.p50))
	if direct.p50 > 0 {
		fmt.Fprintf(w, "API exec p50 - direct agent p50 (server and edge): %s\n", msFine(viaAPI.p50-direct.p50))
	}
	return nil
}

func msFine(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000) }
