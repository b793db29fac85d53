package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/dsec-project/dsec/api"
)

// fncallCmd is `dsec fncall [flags] -- CMD...` (one call on a warm pool),
// `dsec fncall pools` and `dsec fncall warm --size N`.
func fncallCmd(ctx context.Context, args []string) error {
	sub := ""
	if len(args) > 0 && (args[0] == "pools" || args[0] == "warm") {
		sub, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("dsec fncall "+sub, flag.ContinueOnError)
	newClient := clientFlags(fs)
	layers := &api.LayerRefs{}
	var res api.Resources
	if sub != "pools" {
		fs.StringVar(&layers.Base, "base", "base:minimal", "base layer ref")
		fs.StringVar(&layers.Workspace, "workspace", "", "workspace layer ref")
		fs.StringVar(&layers.Toolkit, "toolkit", "", "toolkit layer ref")
		fs.Float64Var(&res.CPU, "cpu", 0, "CPU cores of the pool's sandboxes")
		fs.Int64Var(&res.MemoryMB, "memory", 0, "memory limit of the pool's sandboxes, MB")
	}
	switch sub {
	case "pools":
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		list, err := newClient().ListPools(ctx)
		if err != nil {
			return printErrorCode(err)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "POOL\tBASE\tWORKSPACE\tTOOLKIT\tSIZE\tIDLE\tBUSY\tRESETTING\tCREATING\tWAITING\tTARGET\tCALLS\tRESETS")
		for _, p := range list.Pools {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", p.ID, p.Layers.Base, p.Layers.Workspace,
				p.Layers.Toolkit, p.Size, p.Idle, p.Busy, p.Resetting, p.Creating, p.Waiting, p.Target, p.Calls, p.Resets)
		}
		return tw.Flush()
	case "warm":
		size := fs.Int("size", 1, "sandboxes the pool should hold")
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		p, err := newClient().WarmPool(ctx, &api.FnCallWarmRequest{Layers: layers, Resources: res, Size: *size})
		if err != nil {
			return printErrorCode(err)
		}
		return printJSON(p)
	}
	var env stringList
	shell := fs.String("shell", "", "run this string with /bin/sh -c instead of CMD...")
	cwd := fs.String("cwd", "", "working directory")
	timeout := fs.Duration("timeout", 0, "bound on the whole call, waiting for a sandbox included (default 1m)")
	stdin := fs.Bool("i", false, "send this program's stdin to the command")
	fs.Var(&env, "env", "KEY=VALUE (repeatable)")
	_, cmd, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if (len(cmd) == 0) == (*shell == "") {
		return errors.New("usage: dsec fncall [flags] -- CMD [ARGS...]  (or --shell STRING)")
	}
	req := api.FnCallRequest{Layers: layers, Resources: res, Cmd: cmd, Shell: *shell, Cwd: *cwd,
		TimeoutMs: timeout.Milliseconds()}
	if req.Env, err = keyValues(env, "env"); err != nil {
		return err
	}
	if *stdin {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		req.Stdin, req.StdinEncoding = base64.StdEncoding.EncodeToString(b), "base64"
	}
	r, err := newClient().FnCall(ctx, &req)
	if err != nil {
		return printErrorCode(err)
	}
	out, err := r.StdoutBytes()
	if err != nil {
		return err
	}
	errOut, err := r.StderrBytes()
	if err != nil {
		return err
	}
	os.Stdout.Write(out)
	os.Stderr.Write(errOut)
	if r.TimedOut {
		fmt.Fprintln(os.Stderr, "dsec: command timed out")
	}
	if r.ExitCode != 0 {
		return exitError(r.ExitCode)
	}
	return nil
}
