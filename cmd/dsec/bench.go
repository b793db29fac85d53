package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/dsec-project/dsec/internal/bench"
)

func benchCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: dsec bench create|trajectory [flags]")
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
		fs.BoolVar(&cfg.Baseline, "baseline", true, "also time bare `runc run` (needs root, on the server's machine)")
		fs.StringVar(&cfg.WorkDir, "workdir", os.TempDir(), "scratch directory for the baseline")
		fs.StringVar(&cfg.Runc, "runc", "runc", "runc binary for the baseline")
		fs.StringVar(&cfg.Network, "network", "none", "network mode of the sandboxes: none, or open (the node needs --net-subnet)")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		return bench.Create(ctx, cfg)
	case "trajectory":
		cfg := bench.TrajectoryConfig{Out: os.Stdout}
		fs.StringVar(&cfg.Base, "base", "base:minimal", "base layer")
		fs.IntVar(&cfg.Steps, "steps", 200, "steps per measure")
		fs.IntVar(&cfg.Concurrency, "concurrency", 16, "trainers at a time in the throughput measure")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		cfg.Client = newClient()
		return bench.Trajectory(ctx, cfg)
	}
	return fmt.Errorf("unknown benchmark %q", sub)
}
