package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// sandboxLogs is `dsec sandbox logs [-f] ID PID`: a background process's
// stdout and stderr, to this program's stdout and stderr; with -f until it
// exits, then its exit code is dsec's.
func sandboxLogs(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	follow := fs.Bool("f", false, "follow: keep printing until the process exits, and exit with its exit code")
	stream := fs.String("stream", "", "stdout or stderr (default: both)")
	offset := fs.Int64("offset", 0, "start at this offset of stdout (or of --stream)")
	errOffset := fs.Int64("stderr-offset", 0, "start at this offset of stderr")
	pos, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return errors.New("usage: dsec sandbox logs [-f] [--stream S] [--offset N] ID PID")
	}
	o := client.LogOptions{Stream: *stream, Offset: *offset, StderrOffset: *errOffset, Follow: *follow}
	res, err := newClient().ProcessLogs(ctx, pos[0], pos[1], o, func(ev api.OutputEvent) error {
		b, err := client.OutputBytes(ev)
		if err != nil {
			return err
		}
		if ev.Skipped > 0 {
			fmt.Fprintf(os.Stderr, "dsec: %d bytes of %s lost to the ring\n", ev.Skipped, ev.Stream)
		}
		if ev.Stream == "stderr" {
			_, err = os.Stderr.Write(b)
		} else {
			_, err = os.Stdout.Write(b)
		}
		return err
	})
	if err != nil {
		return printErrorCode(err)
	}
	if res != nil && res.ExitCode != 0 {
		return exitError(res.ExitCode)
	}
	return nil
}
