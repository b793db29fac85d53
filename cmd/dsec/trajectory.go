package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

func trajectoryCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: dsec trajectory get|rm|restore ID")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("dsec trajectory "+sub, flag.ContinueOnError)
	newClient := clientFlags(fs)
	switch sub {
	case "get":
		jsonOut := fs.Bool("json", false, "print the log as JSON")
		return withIDs(ctx, fs, newClient, args, 1, func(c *client.Client, id string) error {
			l, err := c.GetTrajectory(ctx, id)
			if err != nil || *jsonOut {
				if err == nil {
					err = printJSON(l)
				}
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "STEP\tSTATE\tEXIT\tSANDBOX\tSTARTED\tFINGERPRINT")
			for _, st := range l.Steps {
				exit := "-"
				if st.ExitCode != nil {
					exit = fmt.Sprint(*st.ExitCode)
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%.19s\n", st.Step, st.State, exit, st.Sandbox,
					st.StartedAt.Local().Format(time.DateTime), st.Fingerprint)
			}
			if err := tw.Flush(); err != nil || (l.CheckpointEvery == 0 && len(l.Checkpoints) == 0) {
				return err
			}
			fmt.Printf("\ncheckpoint every %d steps\n", l.CheckpointEvery)
			fmt.Fprintln(tw, "CHECKPOINT\tSANDBOX\tSIZE\tTAKEN\tSNAPSHOT")
			for _, cp := range l.Checkpoints {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", cp.Step, cp.Sandbox, humanBytes(cp.Size),
					cp.CreatedAt.Local().Format(time.DateTime), cp.Snapshot)
			}
			return tw.Flush()
		})
	case "restore":
		step := fs.Int64("step", 0, "the checkpoint's step (default: the newest)")
		ttl := fs.Duration("ttl", 0, "lease of the new sandbox (default: the checkpointed sandbox's)")
		jsonOut := fs.Bool("json", false, "print the answer as JSON")
		return withIDs(ctx, fs, newClient, args, 1, func(c *client.Client, id string) error {
			res, err := c.RestoreTrajectory(ctx, &api.RestoreRequest{Trajectory: id, Step: *step,
				TTLSeconds: int64(ttl.Seconds())})
			if err != nil || *jsonOut {
				if err == nil {
					err = printJSON(res)
				}
				return err
			}
			fmt.Println(res.Sandbox.ID)
			fmt.Fprintf(os.Stderr, "dsec: %s restored from the checkpoint after step %d; steps up to it replay there\n",
				res.Sandbox.ID, res.Checkpoint.Step)
			return nil
		})
	case "rm", "delete":
		from := fs.Int64("from-step", 0, "drop only the steps from this one on")
		return withIDs(ctx, fs, newClient, args, -1, func(c *client.Client, id string) error {
			return c.DeleteTrajectory(ctx, id, *from)
		})
	}
	return fmt.Errorf("unknown command: dsec trajectory %s", sub)
}
