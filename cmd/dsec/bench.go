package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/bench"
	"github.com/dsec-project/dsec/internal/server"
)

func benchCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: dsec bench create|exec|density|fork|reset|seccomp|fncall|runcode|batch|trajectory|image|microvm|fullvm|cluster|soak|chaos [flags]")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("dsec bench "+sub, flag.ContinueOnError)
	newClient := clientFlags(fs)
	switch sub {
	case "create":
		cfg := bench.CreateConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer")
		fs.IntVar(&cfg.Sequential, "n", 50, "sequential create→exec→destroy cycles")
		fs.IntVar(&cfg.Parallel, "parallel-n", 256, "cycles in the parallel run")
		fs.IntVar(&cfg.Concurrency, "concurrency", 32, "cycles at a time in the parallel run")
		fs.IntVar(&cfg.Execs, "execs", 500, "warm exec round trips")
		fs.IntVar(&cfg.Warmup, "warmup", 32, "untimed create→exec→destroy cycles first (8 at a time), so that the node's blank pool has seen the demand it follows (0: none, time a node fresh from rest)")
		fs.BoolVar(&cfg.Baseline, "baseline", true, "also time bare `runc run` (needs root, on the server's machine)")
		fs.StringVar(&cfg.WorkDir, "workdir", os.TempDir(), "scratch directory for the baseline")
		fs.StringVar(&cfg.Runc, "runc", "runc", "runc binary for the baseline")
		fs.StringVar(&cfg.Network, "network", "none", "network mode of the sandboxes: none, or open (the node needs --net-subnet)")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		return bench.Create(ctx, cfg)
	case "exec":
		cfg := bench.ExecConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer")
		fs.IntVar(&cfg.N, "n", 2000, "warm execs per measure")
		fs.Float64Var(&cfg.CPU, "cpu", 1, "cpu of the sandbox")
		fs.StringVar(&cfg.DataDir, "data", defaultDataDir(), "the all-in-one server's data directory, for the direct agent call (\"\": skip it)")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		return bench.Exec(ctx, cfg)
	case "fork":
		cfg := bench.ForkConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer")
		fs.IntVar(&cfg.Copies, "n", 8, "copies (K)")
		fs.IntVar(&cfg.DataMB, "data-mb", 200, "MiB the parent writes before the fork")
		fs.StringVar(&cfg.StoreDir, "store-dir", "", "the server's local layer store (<data>/store), to measure its growth")
		fs.IntVar(&cfg.ServerPID, "server-pid", 0, "pid of the server, to count what it writes to the node's disk")
		backendName := fs.String("backend", "container", "container, or microvm: fork with memory, and hibernate")
		memMB := fs.Int64("memory-mb", 512, "microvm: the guest's RAM")
		fillMB := fs.Int64("fill-mb", 128, "microvm: MiB of the guest's RAM the parent fills before the fork")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		switch *backendName {
		case api.BackendContainer:
		case api.BackendMicroVM:
			return bench.ForkVM(ctx, bench.ForkVMConfig{Client: cfg.Client, Base: cfg.Base, Copies: cfg.Copies,
				MemoryMB: *memMB, FillMB: *fillMB, Out: os.Stdout})
		default:
			return fmt.Errorf("--backend %q: want container or microvm", *backendName)
		}
		return bench.Fork(ctx, cfg)
	case "density":
		cfg := bench.DensityConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer")
		fs.IntVar(&cfg.Step, "step", 250, "sandboxes added per step (one batch create)")
		fs.IntVar(&cfg.Max, "max", 0, "live sandboxes to stop at (default: until the nodes' memory or CPU limit is allocated)")
		fs.Float64Var(&cfg.CPU, "cpu", 0.05, "cpu of each sandbox")
		fs.Int64Var(&cfg.MemoryMB, "memory", 16, "memory_mb of each sandbox")
		fs.IntVar(&cfg.Singles, "singles", 5, "create→first exec→destroy cycles timed per step")
		fs.IntVar(&cfg.Execs, "execs", 50, "warm execs on random live sandboxes timed per step")
		fs.DurationVar(&cfg.Pause, "pause", 0, "wait between a single's destroy and the next single's create (0: back to back)")
		fs.BoolVar(&cfg.Empty, "empty", true, "time the singles again on the empty node after the teardown, a baseline next to the first step")
		fs.Float64Var(&cfg.Rest, "rest", 0.15, "time the singles once the machine's CPUs are at most this share busy over a second (at most 60s after the batch; 0: at once)")
		fs.IntVar(&cfg.BaselineN, "baseline-n", 10, "bare `runc run`s timed at the first and the last step (0: none)")
		fs.StringVar(&cfg.WorkDir, "workdir", os.TempDir(), "scratch directory for the baseline")
		fs.StringVar(&cfg.Runc, "runc", "runc", "runc binary for the baseline")
		fs.StringVar(&cfg.DataDir, "data", "", "the node's edge data directory, checked for leftovers (default: found from the edge's command line)")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		if cfg.Step <= 0 || cfg.CPU <= 0 || cfg.MemoryMB <= 0 || cfg.Pause < 0 || cfg.Rest < 0 || cfg.Rest > 1 {
			return errors.New("dsec bench density: --step, --cpu and --memory must be positive, --pause not negative, --rest from 0 to 1")
		}
		if os.Geteuid() != 0 {
			return errors.New("dsec bench density reads the node's /proc and runs runc: run it as root on the server's machine")
		}
		cfg.URL = fs.Lookup("url").Value.String()
		cfg.Client = newClient()
		return bench.Density(ctx, cfg)
	case "reset":
		cfg := bench.ResetConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer")
		fs.IntVar(&cfg.Rounds, "n", 40, "episodes per measure")
		fs.IntVar(&cfg.Concurrency, "concurrency", 32, "sandboxes at a time in the parallel measures")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		return bench.Reset(ctx, cfg)
	case "seccomp":
		cfg := bench.SeccompConfig{Out: os.Stdout}
		fs.IntVar(&cfg.Runs, "n", 40, "`runc run` of each kind")
		fs.StringVar(&cfg.WorkDir, "workdir", os.TempDir(), "scratch directory")
		fs.StringVar(&cfg.Runc, "runc", "runc", "runc binary")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		return bench.Seccomp(ctx, cfg)
	case "fncall":
		cfg := bench.FnCallConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer")
		fs.BoolVar(&cfg.Python, "python", false, "also time `python3 -c` (the base needs python3, e.g. debian:12)")
		fs.IntVar(&cfg.Calls, "n", 500, "calls per command")
		fs.IntVar(&cfg.Baseline, "baseline-n", 60, "create→exec→destroy cycles per command for the baseline")
		fs.IntVar(&cfg.Concurrency, "concurrency", 8, "calls at a time")
		fs.Float64Var(&cfg.Rate, "rate", 0, "also send the calls open-loop at this many per second")
		fs.Int64Var(&cfg.MemoryMB, "memory", 128, "memory_mb of the sandboxes")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		return bench.FnCall(ctx, cfg)
	case "runcode":
		cfg := bench.RunCodeConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", server.DefaultFusionBase, "base of the create-per-call baseline (the server's --sandboxfusion-layers base)")
		fs.StringVar(&cfg.Prefix, "prefix", server.DefaultFusionPrefix, "the server's --sandboxfusion-prefix")
		fs.IntVar(&cfg.Calls, "n", 200, "/run_code calls")
		fs.IntVar(&cfg.Baseline, "baseline-n", 40, "create→write→exec→destroy cycles for the baseline")
		fs.IntVar(&cfg.Concurrency, "concurrency", 8, "calls at a time")
		fs.Int64Var(&cfg.MemoryMB, "memory", 256, "memory_limit_MB of the calls and memory_mb of the baseline's sandboxes")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		cfg.URL, cfg.Key = fs.Lookup("url").Value.String(), fs.Lookup("key").Value.String()
		if cfg.Key == "" {
			cfg.Key = localAdminKey()
		}
		return bench.RunCode(ctx, cfg)
	case "batch":
		cfg := bench.BatchConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer")
		fs.IntVar(&cfg.Count, "n", 1000, "sandboxes in the batch")
		fs.IntVar(&cfg.Baseline, "baseline-n", -1, "sandboxes created by single creates for the baseline (default: as many as the batch; 0: none)")
		fs.IntVar(&cfg.Concurrency, "concurrency", 32, "single creates at a time in the baseline")
		fs.Int64Var(&cfg.MemoryMB, "memory", 16, "memory_mb of each sandbox (the scheduler never overcommits memory)")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		if cfg.Baseline < 0 {
			cfg.Baseline = cfg.Count
		}
		cfg.Client = newClient()
		return bench.Batch(ctx, cfg)
	case "trajectory":
		cfg := bench.TrajectoryConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer")
		fs.IntVar(&cfg.Steps, "steps", 200, "steps per measure")
		fs.IntVar(&cfg.Concurrency, "concurrency", 16, "trainers at a time in the throughput measure")
		ck := bench.CheckpointConfig{Out: os.Stdout}
		fs.IntVar(&ck.Steps, "checkpoint-steps", 20, "checkpointed steps timed (0: skip the checkpoint measures)")
		fs.IntVar(&ck.DataMB, "checkpoint-mb", 64, "MiB the sandbox writes before the checkpointed steps (each checkpoint packs them)")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		if err := bench.Trajectory(ctx, cfg); err != nil || ck.Steps <= 0 {
			return err
		}
		ck.Client, ck.Base, ck.Prefix = cfg.Client, cfg.Base, fmt.Sprintf("bench-ckpt-%d", time.Now().UnixNano())
		return bench.Checkpoints(ctx, ck)
	case "soak":
		cfg := bench.SoakConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer")
		fs.IntVar(&cfg.Sandboxes, "sandboxes", 16, "long-lived sandboxes")
		fs.IntVar(&cfg.Workers, "workers", 2, "exec loops per sandbox (each: a buffered, then a streamed exec)")
		fs.IntVar(&cfg.Churners, "churners", 4, "create→exec→reset→exec→destroy loops")
		fs.DurationVar(&cfg.Duration, "duration", 2*time.Minute, "how long")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		return bench.Soak(ctx, cfg)
	case "chaos":
		cfg := bench.ChaosConfig{Out: os.Stdout}
		minutes := fs.Float64("minutes", 10, "how long the load and the kills run, minutes")
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer")
		fs.IntVar(&cfg.Workers, "workers", 4, "concurrent load loops")
		fs.IntVar(&cfg.MaxLive, "max-live", 12, "most live sandboxes the loops keep")
		fs.DurationVar(&cfg.KillEvery, "kill-every", 10*time.Second, "mean time between kill -9s")
		fs.StringVar(&cfg.WorkDir, "workdir", os.TempDir(), "where the server's data directory is made")
		fs.StringVar(&cfg.Agent, "agent", "", "dsec-agent binary (default: next to dsec)")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		if *minutes <= 0 || cfg.Workers <= 0 || cfg.MaxLive < 2 || cfg.KillEvery <= 0 {
			return errors.New("dsec bench chaos: --minutes, --workers and --kill-every must be positive, --max-live at least 2")
		}
		if os.Geteuid() != 0 {
			return errors.New("dsec bench chaos starts its own all-in-one server and kills its processes: run it as root")
		}
		self, err := os.Executable()
		if err != nil {
			return err
		}
		cfg.Bin = self
		if cfg.Agent == "" {
			cfg.Agent = filepath.Join(filepath.Dir(self), "dsec-agent")
		}
		cfg.Duration = time.Duration(*minutes * float64(time.Minute))
		return bench.Chaos(ctx, cfg)
	case "image":
		return benchImage(ctx, fs, args)
	case "microvm":
		cfg := bench.MicroVMConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer, for both backends")
		fs.IntVar(&cfg.Cycles, "n", 5, "create→first exec→destroy cycles per backend, one at a time")
		fs.IntVar(&cfg.Idle, "idle", 4, "idle sandboxes per backend kept while memory is measured")
		fs.Float64Var(&cfg.Resources.CPU, "cpu", 1, "CPU of each sandbox (vCPUs, rounded up, for microVMs)")
		fs.Int64Var(&cfg.Resources.MemoryMB, "memory-mb", 256, "memory of each sandbox (a microVM's RAM)")
		fs.Int64Var(&cfg.Resources.DiskMB, "disk-mb", 1024, "writable layer of each sandbox")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		return bench.MicroVM(ctx, cfg)
	case "fullvm":
		cfg := bench.FullVMConfig{Out: os.Stdout}
		fs.StringVar(&cfg.VMLayer, "vm-layer", "vm:debian-12", "vm layer of the fullvm sandboxes")
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer of the microVM and the container")
		fs.StringVar(&cfg.Desktop, "desktop", "desktop:toolkit", "desktop toolkit of the container (examples/build_desktop_toolkit.sh; \"\": none)")
		fs.IntVar(&cfg.Cycles, "n", 2, "create→first exec→first screenshot→destroy cycles per backend, one at a time")
		fs.IntVar(&cfg.RoundTrips, "round-trips", 20, "screenshots and inputs timed per backend with a screen")
		fs.IntVar(&cfg.Idle, "idle", 1, "idle sandboxes per backend kept while memory is measured")
		fs.Int64Var(&cfg.VMMemoryMB, "vm-memory-mb", 1024, "RAM of each full VM")
		fs.Int64Var(&cfg.MemoryMB, "memory-mb", 256, "memory of each microVM and container")
		fs.DurationVar(&cfg.ScreenTimeout, "screen-timeout", 2*time.Minute, "wait for a screen that is not blank")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		return bench.FullVM(ctx, cfg)
	case "cluster":
		cfg := bench.ClusterConfig{Out: os.Stdout}
		fs.IntVar(&cfg.Nodes, "nodes", 160, "simulated nodes")
		fs.Float64Var(&cfg.NodeCPU, "node-cpu", 192, "cores per node")
		fs.Int64Var(&cfg.NodeMemoryMB, "node-memory-mb", 1600000, "memory per node, MB (DSec: 250 TB over 160 nodes)")
		fs.DurationVar(&cfg.Duration, "duration", 20*time.Second, "how long creates are sustained")
		fs.IntVar(&cfg.Concurrency, "concurrency", 128, "concurrent API clients")
		fs.IntVar(&cfg.Batch, "batch", 32768, "sandboxes in the one bulk batch")
		fs.IntVar(&cfg.Live, "live", 380000, "live sandboxes when reads are timed")
		stores := fs.String("stores", "sqlite,postgres", "stores to run against")
		fs.StringVar(&cfg.PostgresDSN, "postgres", "", "PostgreSQL database to use (default: start a private server)")
		fs.StringVar(&cfg.WorkDir, "workdir", os.TempDir(), "scratch directory")
		cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run here")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Stores = strings.Split(*stores, ",")
		if *cpuProfile != "" {
			f, err := os.Create(*cpuProfile)
			if err != nil {
				return err
			}
			defer f.Close()
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
		return bench.Cluster(ctx, cfg)
	}
	return fmt.Errorf("unknown benchmark %q", sub)
}

// benchImage runs `dsec bench image` in this process: it plays the nodes
// itself (as root), over the store given.
func benchImage(ctx context.Context, fs *flag.FlagSet, args []string) error {
	cfg := bench.ImageConfig{Out: os.Stdout}
	storeLoc := fs.String("store", "", "layer store the nodes share: a directory or s3://... (default: WORKDIR/store)")
	fs.StringVar(&cfg.Rootfs, "rootfs", "", "a debootstrapped Debian tree for debian:12 (default: debootstrap one)")
	fs.StringVar(&cfg.Repo, "repo", "", "git repository for the workspace layer")
	repoFrom := fs.String("repo-from", "", "or a source tree (e.g. a Go module in the module cache) made into a git repository")
	fs.IntVar(&cfg.N, "n", 64, "sandboxes started at once on a cold node")
	fs.IntVar(&cfg.Concurrency, "concurrency", 16, "creates in flight at a time")
	fs.IntVar(&cfg.SnapshotMB, "snapshot-mb", 100, "MB a sandbox changes before pack_diff")
	fs.StringVar(&cfg.Parts, "parts", "abc", "parts to run: (a) session bytes, (b) cold burst, (c) pack_diff")
	fs.StringVar(&cfg.WorkDir, "workdir", "", "scratch directory on node-local disk (default: a new one in $TMPDIR)")
	agent := fs.String("agent", "", "dsec-agent binary (default: next to dsec)")
	if _, _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("dsec bench image plays the nodes: run it as root")
	}
	if cfg.Repo == "" && *repoFrom == "" {
		return errors.New("dsec bench image needs --repo or --repo-from")
	}
	var err error
	if cfg.WorkDir == "" {
		if cfg.WorkDir, err = os.MkdirTemp("", "dsec-bench-image-"); err != nil {
			return err
		}
		defer os.RemoveAll(cfg.WorkDir)
	}
	nf := nodeFlags{agent: *agent}
	if cfg.AgentPath, err = nf.agentBinary(); err != nil {
		return err
	}
	if cfg.Store, err = openBlobStore(ctx, *storeLoc, filepath.Join(cfg.WorkDir, "store"), "bench"); err != nil {
		return err
	}
	if *repoFrom != "" {
		cfg.Repo = filepath.Join(cfg.WorkDir, "repo")
		if err := bench.RepoFromDir(ctx, *repoFrom, cfg.Repo); err != nil {
			return err
		}
	}
	return bench.Image(ctx, cfg)
}
