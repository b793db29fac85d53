package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

func sandboxCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: dsec sandbox create|ls|get|rm|exec|shell|logs|port-forward|vnc|cp|reset|pause|resume|renew|snapshot|fork|screenshot|input")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("dsec sandbox "+sub, flag.ContinueOnError)
	newClient := clientFlags(fs)
	switch sub {
	case "create":
		return sandboxCreate(ctx, fs, newClient, args)
	case "ls", "list":
		return sandboxList(ctx, fs, newClient, args)
	case "get":
		return withIDs(ctx, fs, newClient, args, 1, func(c *client.Client, id string) error {
			sb, err := c.GetSandbox(ctx, id)
			if err != nil {
				return err
			}
			return printJSON(sb)
		})
	case "rm", "delete":
		return withIDs(ctx, fs, newClient, args, -1, func(c *client.Client, id string) error {
			return c.DeleteSandbox(ctx, id)
		})
	case "reset", "pause", "resume":
		var memory *string
		if sub == "pause" {
			memory = fs.String("memory", "ram", "ram, or disk: hibernate a microVM (its memory saved to the node's disk, its VMM ended)")
		}
		return withIDs(ctx, fs, newClient, args, -1, func(c *client.Client, id string) error {
			var err error
			switch sub {
			case "reset":
				_, err = c.Reset(ctx, id)
			case "pause":
				if *memory == api.PauseMemoryDisk {
					_, err = c.Hibernate(ctx, id)
				} else {
					_, err = c.Pause(ctx, id)
				}
			default:
				_, err = c.Resume(ctx, id)
			}
			return err
		})
	case "renew":
		ttl := fs.Duration("ttl", 0, "the lease ends this long from now (default: the sandbox's ttl)")
		return withIDs(ctx, fs, newClient, args, -1, func(c *client.Client, id string) error {
			sb, err := c.Renew(ctx, id, *ttl)
			if err == nil {
				fmt.Printf("%s\t%s\n", sb.ID, sb.ExpiresAt.Local().Format(time.DateTime))
			}
			return err
		})
	case "snapshot":
		name := fs.String("name", "", "NAME:TAG of the snapshot layer (default snapshot/<id>:<time>)")
		return withIDs(ctx, fs, newClient, args, 1, func(c *client.Client, id string) error {
			l, err := c.Snapshot(ctx, id, *name)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "snapshot %s (%s) of %s\n", l.Ref, humanBytes(l.Size), id)
			fmt.Println(l.Ref)
			return nil
		})
	case "fork":
		return sandboxFork(ctx, fs, newClient, args)
	case "exec":
		return sandboxExec(ctx, fs, newClient, args)
	case "cp":
		return sandboxCopy(ctx, fs, newClient, args)
	case "shell":
		return sandboxShell(ctx, fs, newClient, args)
	case "logs":
		return sandboxLogs(ctx, fs, newClient, args)
	case "port-forward":
		return sandboxPortForward(ctx, fs, newClient, args)
	case "vnc":
		return sandboxVNC(ctx, fs, newClient, args)
	case "screenshot", "input":
		return sandboxScreen(ctx, sub, fs, newClient, args)
	}
	return fmt.Errorf("unknown command: dsec sandbox %s", sub)
}

// withIDs parses flags and runs fn for each id argument (n ids exactly, or
// at least one when n < 0).
func withIDs(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string,
	n int, fn func(*client.Client, string) error) error {
	ids, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 || (n > 0 && len(ids) != n) {
		return fmt.Errorf("usage: %s ID", fs.Name())
	}
	c := newClient()
	for _, id := range ids {
		if err := fn(c, id); err != nil {
			return printErrorCode(err)
		}
	}
	return nil
}

func sandboxCreate(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	req := api.CreateSandboxRequest{Layers: &api.LayerRefs{}}
	var labels, env stringList
	fs.StringVar(&req.Backend, "backend", "", "container (default), fncall, microvm, fullvm")
	fs.StringVar(&req.Layers.Base, "base", "base:minimal", "base layer ref")
	fs.StringVar(&req.Layers.Workspace, "workspace", "", "workspace layer ref")
	fs.StringVar(&req.Layers.Toolkit, "toolkit", "", "toolkit layer ref")
	fs.StringVar(&req.Snapshot, "snapshot", "", "start from this snapshot (instead of --base/--workspace/--toolkit)")
	fs.Float64Var(&req.Resources.CPU, "cpu", 0, "CPU cores")
	fs.Int64Var(&req.Resources.MemoryMB, "memory", 0, "memory limit, MB")
	fs.Int64Var(&req.Resources.DiskMB, "disk", 0, "writable layer size, MB")
	fs.Int64Var(&req.Resources.Pids, "pids", 0, "process limit")
	ttl := fs.Duration("ttl", 0, "lease, renewable with renew (default: the server's)")
	idle := fs.Duration("idle-timeout", 0, "destroy it after this long without API activity (default: the server's)")
	fs.Var(&labels, "label", "KEY=VALUE label (repeatable)")
	fs.Var(&env, "env", "KEY=VALUE environment variable (repeatable)")
	fs.BoolVar(&req.Burst, "burst", false, "may run on a cloud burst node when the cluster is busy")
	fs.Int64Var(&req.AdmissionTimeoutSeconds, "admission-timeout", 0, "seconds to wait while every node with room is busy (0: 60, -1: fail at once)")
	jsonOut := fs.Bool("json", false, "print the whole sandbox as JSON instead of its id")
	count := fs.Int("count", 1, fmt.Sprintf("create this many in one batch (up to %d), with a progress bar; prints one id per line", api.MaxBatchCount))
	if _, _, err := parseArgs(fs, args); err != nil {
		return err
	}
	req.TTLSeconds = int64(ttl.Seconds())
	req.IdleTimeoutSeconds = int64(idle.Seconds())
	if req.Snapshot != "" {
		req.Layers = nil
	}
	var err error
	if req.Labels, err = keyValues(labels, "label"); err != nil {
		return err
	}
	if req.Env, err = keyValues(env, "env"); err != nil {
		return err
	}
	if *count != 1 {
		return createMany(ctx, newClient(), &req, *count)
	}
	sb, err := newClient().CreateSandbox(ctx, &req)
	if err != nil {
		return printErrorCode(err)
	}
	if *jsonOut {
		return printJSON(sb)
	}
	fmt.Println(sb.ID)
	return nil
}

func sandboxList(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	var labels stringList
	fs.Var(&labels, "label", "KEY=VALUE filter (repeatable)")
	all := fs.Bool("all", false, "include deleted and failed sandboxes")
	quiet := fs.Bool("q", false, "print ids only")
	if _, _, err := parseArgs(fs, args); err != nil {
		return err
	}
	lm, err := keyValues(labels, "label")
	if err != nil {
		return err
	}
	c := newClient()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	if !*quiet {
		fmt.Fprintln(tw, "ID\tBACKEND\tSTATE\tNODE\tBASE\tCREATED")
	}
	opts := client.ListOptions{Labels: lm, All: *all, Limit: 1000}
	for {
		page, err := c.ListSandboxes(ctx, opts)
		if err != nil {
			return printErrorCode(err)
		}
		for _, sb := range page.Sandboxes {
			if *quiet {
				fmt.Fprintln(tw, sb.ID)
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.Backend, sb.State, sb.Node, sb.Layers.Base,
				sb.CreatedAt.Local().Format(time.DateTime))
		}
		if page.NextPageToken == "" {
			break
		}
		opts.PageToken = page.NextPageToken
	}
	return tw.Flush()
}

// sandboxExec runs a command, streaming its output through, and exits
// with the command's exit code.
func sandboxExec(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	var env stringList
	shell := fs.String("shell", "", "run this string with /bin/sh -c instead of CMD...")
	cwd := fs.String("cwd", "", "working directory")
	timeout := fs.Duration("timeout", 0, "kill the command after this long (default: the server's)")
	stdin := fs.Bool("i", false, "send this program's stdin to the command")
	traj := fs.String("trajectory", "", "record the command as a step of this trajectory (replayed if already recorded)")
	step := fs.Int64("step", 0, "the step number, with --trajectory")
	every := fs.Int64("checkpoint-every", 0, "with --trajectory: checkpoint the sandbox after every step that is a multiple of this, from now on (-1: stop)")
	fs.Var(&env, "env", "KEY=VALUE (repeatable)")
	pos, cmd, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (len(cmd) == 0) == (*shell == "") {
		return errors.New("usage: dsec sandbox exec [flags] ID -- CMD [ARGS...]  (or --shell STRING)")
	}
	req := api.ExecRequest{Cmd: cmd, Shell: *shell, Cwd: *cwd, TimeoutMs: timeout.Milliseconds()}
	if *traj != "" {
		req.Trajectory = &api.Trajectory{ID: *traj, Step: *step, CheckpointEvery: *every}
	}
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
	res, err := newClient().ExecStream(ctx, pos[0], &req, func(ev api.ExecEvent) error {
		b, err := ev.Bytes()
		if err != nil {
			return err
		}
		if ev.Stderr != nil {
			_, err = os.Stderr.Write(b)
		} else {
			_, err = os.Stdout.Write(b)
		}
		return err
	})
	if err != nil {
		return printErrorCode(err)
	}
	if res.Truncated {
		fmt.Fprintf(os.Stderr, "dsec: output truncated (%d stdout and %d stderr bytes dropped)\n",
			res.StdoutDropped, res.StderrDropped)
	}
	if res.TimedOut {
		fmt.Fprintln(os.Stderr, "dsec: command timed out")
	}
	if res.Replayed {
		fmt.Fprintln(os.Stderr, "dsec: replayed from the trajectory log; nothing ran")
	}
	if res.ExitCode != 0 {
		return exitError(res.ExitCode)
	}
	return nil
}

// sandboxCopy copies a file into or out of a sandbox: ID:/path to a local
// path ("-" for stdout), or a local path ("-" for stdin) to ID:/path.
func sandboxCopy(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	pos, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return errors.New("usage: dsec sandbox cp SRC DST   (one of them ID:/path; - for stdin/stdout)")
	}
	c := newClient()
	srcID, srcPath, srcRemote := remotePath(pos[0])
	dstID, dstPath, dstRemote := remotePath(pos[1])
	switch {
	case srcRemote && !dstRemote:
		rc, err := c.OpenFile(ctx, srcID, srcPath)
		if err != nil {
			return printErrorCode(err)
		}
		defer rc.Close()
		var w io.Writer = os.Stdout
		if pos[1] != "-" {
			f, err := os.Create(pos[1])
			if err != nil {
				return err
			}
			defer f.Close()
			w = f
		}
		_, err = io.Copy(w, rc)
		return err
	case dstRemote && !srcRemote:
		var r io.Reader = os.Stdin
		if pos[0] != "-" {
			f, err := os.Open(pos[0])
			if err != nil {
				return err
			}
			defer f.Close()
			r = f
		}
		return printErrorCode(c.WriteFile(ctx, dstID, dstPath, r, 0))
	}
	return errors.New("exactly one of SRC and DST must be ID:/path")
}

func remotePath(s string) (id, path string, ok bool) {
	id, path, ok = strings.Cut(s, ":")
	if !ok || !strings.HasPrefix(path, "/") || id == "" {
		return "", "", false
	}
	return id, path, true
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
