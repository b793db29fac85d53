package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// sandboxFork is `dsec sandbox fork ID -n K`: it prints the copies' ids,
// one a line (with --trajectory, each with its trajectory id).
func sandboxFork(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	var req api.ForkRequest
	var labels stringList
	fs.IntVar(&req.Count, "n", 1, fmt.Sprintf("how many copies (1 to %d)", api.MaxForkCount))
	fs.Var(&labels, "label", "KEY=VALUE label added to the copies (repeatable)")
	traj := fs.String("trajectory", "", "fork this trajectory log along (each copy gets its own, printed after its id)")
	ttl := fs.Duration("ttl", 0, "the copies' lease (default: the parent's)")
	jsonOut := fs.Bool("json", false, "print the whole answer as JSON")
	ids, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(ids) != 1 {
		return fmt.Errorf("usage: dsec sandbox fork ID -n K")
	}
	if req.Labels, err = keyValues(labels, "label"); err != nil {
		return err
	}
	if *traj != "" {
		req.Trajectory = &api.ForkTrajectoryRequest{ID: *traj}
	}
	req.TTLSeconds = int64(ttl.Seconds())
	start := time.Now()
	res, err := newClient().Fork(ctx, ids[0], &req)
	if err != nil {
		return printErrorCode(err)
	}
	if *jsonOut {
		return printJSON(res)
	}
	fmt.Fprintf(os.Stderr, "forked %s into %d copies from %s in %s (parent frozen %d ms)\n", ids[0],
		len(res.Sandboxes), res.Layer, time.Since(start).Round(time.Millisecond), res.PausedMs)
	for i, sb := range res.Sandboxes {
		if i < len(res.Trajectories) {
			fmt.Printf("%s\t%s\n", sb.ID, res.Trajectories[i].ID)
			continue
		}
		fmt.Println(sb.ID)
	}
	return nil
}
