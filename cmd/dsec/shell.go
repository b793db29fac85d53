package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"github.com/dsec-project/dsec/client"
)

// sandboxShell is `dsec sandbox shell ID [-- CMD...]`: an interactive
// terminal in a sandbox. With a terminal on stdin it is put in raw mode,
// so every key (Ctrl-C included) goes to the sandbox; window size changes
// follow. The command's exit code is dsec's.
func sandboxShell(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	var env stringList
	cwd := fs.String("cwd", "", "working directory")
	fs.Var(&env, "env", "KEY=VALUE (repeatable)")
	pos, cmd, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: dsec sandbox shell [flags] ID [-- CMD [ARGS...]]")
	}
	o := client.TerminalOptions{Cmd: cmd, Cwd: *cwd}
	if o.Env, err = keyValues(env, "env"); err != nil {
		return err
	}
	in, out := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	if w, h, err := term.GetSize(out); err == nil {
		o.Rows, o.Cols = h, w
	}
	t, err := newClient().Terminal(ctx, pos[0], o)
	if err != nil {
		return printErrorCode(err)
	}
	defer t.Close()
	if term.IsTerminal(in) {
		old, err := term.MakeRaw(in)
		if err != nil {
			return fmt.Errorf("raw mode: %w", err)
		}
		defer term.Restore(in, old)
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		for range winch {
			if w, h, err := term.GetSize(out); err == nil {
				_ = t.Resize(h, w)
			}
		}
	}()
	go func() { _, _ = io.Copy(t, os.Stdin) }()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(os.Stdout, t)
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done(): // SIGTERM (in raw mode Ctrl-C is a key, not a signal)
		return ctx.Err()
	}
	if err != nil {
		return printErrorCode(err)
	}
	code, _, ok := t.Exit()
	if !ok {
		return errors.New("terminal closed without an exit status")
	}
	if code != 0 {
		return exitError(code)
	}
	return nil
}
