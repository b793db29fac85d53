package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/edge"
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
// against, in the same run, the same exec sent straight to the node's edge
// (what the server adds), straight to the sandbox's agent over its unix
// socket (what the edge adds) and a fork+exec from Go of the binary
// base:minimal's `true` is, the host's static busybox (the least an exec
// of it costs; a dynamically linked /bin/true, loader and libc, costs
// more here and flattered the ratio), and a fork+exec of a static
// executable that only exits, the floor of any exec on the machine. The
// measures take turns in rounds, so that a machine whose load drifts
// weighs on all of them alike.
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
	type measure struct {
		name string
		f    func() error
		d    []time.Duration
		s    stats
	}
	measures := []*measure{{name: "dsec warm exec through the HTTP API", f: func() error {
		res, err := cfg.Client.Exec(ctx, sb.ID, req)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		return err
	}}}
	if cfg.DataDir != "" {
		edgeSock := filepath.Join(cfg.DataDir, "edge.sock")
		sock := filepath.Join(cfg.DataDir, "edge", "container", "sandboxes", sb.ID, "agent.sock")
		if _, err := os.Stat(edgeSock); err != nil {
			fmt.Fprintf(w, "%-48s %s\n", "direct edge call", "skipped: "+err.Error())
		} else if ec, err := edge.NewClient("unix://"+edgeSock, ""); err != nil {
			return err
		} else {
			measures = append(measures, &measure{name: "direct edge call (edge.sock, no server)", f: func() error {
				_, err := ec.Exec(ctx, sb.ID, req)
				return err
			}})
		}
		if _, err := os.Stat(sock); err != nil {
			fmt.Fprintf(w, "%-48s %s\n", "direct agent call", "skipped: "+err.Error())
		} else {
			ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			})
			defer ag.Close()
			measures = append(measures, &measure{name: "direct agent call (unix socket)", f: func() error {
				_, err := ag.Exec(ctx, req)
				return err
			}})
		}
	}
	fork := &measure{name: "fork+exec busybox true from Go", f: func() error { return exec.CommandContext(ctx, "/bin/busybox", "true").Run() }}
	measures = append(measures, fork)
	tmp, err := os.MkdirTemp("", "dsec-bench-exec-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if nothing, err := writeNothing(tmp); err != nil {
		fmt.Fprintf(w, "%-48s %s\n", "exec floor", "skipped: "+err.Error())
	} else {
		measures = append(measures, &measure{name: "fork+exec a static exit(0) from Go (floor)", f: func() error {
			return exec.CommandContext(ctx, nothing).Run()
		}})
	}
	// A few untimed rounds first: connections, caches, page faults.
	for _, m := range measures {
		for range min(20, n) {
			if err := m.f(); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
		}
	}
	const rounds = 10
	for r := range rounds {
		k := n/rounds + b2i(r < n%rounds)
		for _, m := range measures {
			for range k {
				t0 := time.Now()
				if err := m.f(); err != nil {
					return fmt.Errorf("%s: %w", m.name, err)
				}
				m.d = append(m.d, time.Since(t0))
			}
		}
	}
	fmt.Fprintf(w, "%-48s %10s %10s %12s\n", "measure", "p50", "p99", "p50/fork")
	for _, m := range measures {
		m.s = summarize(m.d)
	}
	for _, m := range measures {
		fmt.Fprintf(w, "%-48s %10s %10s %11.2f×\n", m.name, msFine(m.s.p50), msFine(m.s.p99), float64(m.s.p50)/float64(fork.s.p50))
	}
	fmt.Fprintln(w)
	for i := 0; i+1 < len(measures) && measures[i+1] != fork; i++ {
		fmt.Fprintf(w, "p50 %s - %s: %s\n", short(measures[i].name), short(measures[i+1].name), msFine(measures[i].s.p50-measures[i+1].s.p50))
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// short is a measure's name up to its first parenthesis.
func short(name string) string {
	if i := strings.IndexByte(name, '('); i > 0 {
		return strings.TrimSpace(name[:i])
	}
	return name
}

func msFine(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000) }
