package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// RunCodeConfig sets up `dsec bench runcode`.
type RunCodeConfig struct {
	Client *client.Client
	// URL is the server's, Key the API key; Prefix is where the server
	// mounts SandboxFusion (--sandboxfusion-prefix).
	URL, Key, Prefix string
	// Base is the layer of the create-per-call baseline: the server's
	// --sandboxfusion-layers base, so both sides run the same python3.
	Base string
	// Calls /run_code calls, Concurrency at a time; Baseline
	// create→write→exec→destroy cycles at the same concurrency.
	Calls, Baseline, Concurrency int
	MemoryMB                     int64
	Out                          io.Writer
}

// runCodeSource is what each call runs: a verl-style test case, reading
// its input from stdin.
const runCodeSource = "a, b = map(int, input().split())\nprint(a + b)\n"

// RunCode times SandboxFusion's /run_code, with the body verl sends,
// against the same program run by creating a sandbox per call, in the
// same run.
func RunCode(ctx context.Context, cfg RunCodeConfig) error {
	w := cfg.Out
	fmt.Fprintf(w, "dsec bench runcode: %d /run_code calls and %d create-per-call baselines, %d at a time, base %s\n\n",
		cfg.Calls, cfg.Baseline, cfg.Concurrency, cfg.Base)
	body, _ := json.Marshal(map[string]any{
		"compile_timeout": 10, "run_timeout": 10, "code": runCodeSource, "stdin": "2 3",
		"memory_limit_MB": cfg.MemoryMB, "language": "python", "files": map[string]string{}, "fetch_files": []string{},
	})
	url := strings.TrimSuffix(cfg.URL, "/") + strings.TrimSuffix(cfg.Prefix, "/") + "/run_code"
	call := func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+cfg.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var out struct {
			Status    string `json:"status"`
			RunResult *struct {
				Stdout string `json:"stdout"`
			} `json:"run_result"`
		}
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 200 {
			return fmt.Errorf("run_code: %d %s", resp.StatusCode, b)
		}
		if out.Status != "Success" || out.RunResult == nil || out.RunResult.Stdout != "5\n" {
			return fmt.Errorf("run_code: %s", b)
		}
		return nil
	}
	layers := &api.LayerRefs{Base: cfg.Base}
	res := api.Resources{MemoryMB: cfg.MemoryMB}
	cold := func() error {
		sb, err := cfg.Client.CreateSandbox(ctx, &api.CreateSandboxRequest{Layers: layers, Resources: res})
		if err != nil {
			return err
		}
		defer cfg.Client.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		if err := cfg.Client.WriteFile(ctx, sb.ID, "/tmp/sandboxfusion/main.py", strings.NewReader(runCodeSource), 0o644); err != nil {
			return err
		}
		r, err := cfg.Client.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"python3", "main.py"}, Cwd: "/tmp/sandboxfusion",
			Stdin: "2 3", TimeoutMs: 10_000})
		if err == nil && (r.ExitCode != 0 || r.Stdout != "5\n") {
			err = fmt.Errorf("baseline: exit %d, stdout %q, stderr %q", r.ExitCode, r.Stdout, r.Stderr)
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
	bs, bwall, err := timeMany(cfg.Baseline, cfg.Concurrency, cold)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	fmt.Fprintf(w, "%-46s %9s %9s %11s\n", "measure", "p50", "p99", "calls/s")
	fmt.Fprintf(w, "%-46s %9s %9s %11s\n", "/run_code python (warm pool)", ms(fs.p50), ms(fs.p99), perSec(cfg.Calls, fwall))
	fmt.Fprintf(w, "%-46s %9s %9s %11s\n", "baseline: create→write→exec→destroy", ms(bs.p50), ms(bs.p99), perSec(cfg.Baseline, bwall))
	fmt.Fprintf(w, "%-46s %8.1f× lower p50, %.1f× the calls/s\n", "", float64(bs.p50)/float64(fs.p50),
		(float64(cfg.Calls)/fwall.Seconds())/(float64(cfg.Baseline)/bwall.Seconds()))
	return nil
}
