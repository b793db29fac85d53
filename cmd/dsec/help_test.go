package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"testing"
)

// capture runs the CLI with args and returns what it wrote to stdout and
// stderr, and its error.
func capture(t *testing.T, args ...string) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = w, w
	done := make(chan string)
	go func() {
		var b bytes.Buffer
		io.Copy(&b, r)
		done <- b.String()
	}()
	runErr := run(context.Background(), args)
	os.Stdout, os.Stderr = oldOut, oldErr
	w.Close()
	return <-done, runErr
}

// dsec help X, dsec X --help and dsec X Y -h all print usage, and none of
// them is an unknown command.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"help"}, "dsec sandbox create|ls"},
		{[]string{"sandbox", "--help"}, "usage: dsec sandbox create|ls|get"},
		{[]string{"sandbox", "-h"}, "usage: dsec sandbox create|ls|get"},
		{[]string{"help", "sandbox"}, "usage: dsec sandbox create|ls|get"},
		{[]string{"layer", "--help"}, "usage: dsec layer build"},
		{[]string{"node", "help"}, "usage: dsec node ls"},
		{[]string{"sandbox", "create", "-h"}, "-workspace"},
		{[]string{"help", "sandbox", "create"}, "-workspace"},
		{[]string{"server", "--help"}, "-listen"},
	} {
		out, err := capture(t, tc.args...)
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			t.Errorf("dsec %s: %v", strings.Join(tc.args, " "), err)
		}
		if !strings.Contains(out, tc.want) {
			t.Errorf("dsec %s printed %q, want it to hold %q", strings.Join(tc.args, " "), out, tc.want)
		}
		if !helpAsked(tc.args) && tc.args[0] != "help" {
			t.Errorf("dsec %s: not taken for a request for help", strings.Join(tc.args, " "))
		}
	}
	if helpAsked([]string{"sandbox", "exec", "ID", "--", "ls", "-h"}) {
		t.Error("a -h after -- (the command's own) was taken for dsec's")
	}
}

// TestUsageListsEverySubcommand: the top-level usage names every
// subcommand a group's own usage names.
func TestUsageListsEverySubcommand(t *testing.T) {
	top := strings.Join(strings.Fields(strings.ReplaceAll(usage, "|\n", "|")), " ")
	top = strings.ReplaceAll(top, "| ", "|")
	for _, group := range []string{"sandbox", "bench", "layer", "trajectory"} {
		_, err := capture(t, group)
		if err == nil {
			t.Fatalf("dsec %s: no usage error", group)
		}
		_, list, ok := strings.Cut(err.Error(), "usage: dsec "+group+" ")
		if !ok {
			t.Fatalf("dsec %s: %v", group, err)
		}
		subs := strings.Fields(list)[0]
		if !strings.Contains(top, "dsec "+group+" "+subs) {
			t.Errorf("dsec help lists for %s not %s", group, subs)
		}
	}
}
