// Command dsec is the one binary of dsec: the all-in-one server, a node
// agent (edge), and the client CLI. Run `dsec help` for the commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

const usage = `dsec — sandboxes for agentic RL at scale

Server side:
  dsec server [flags]            all-in-one: control plane + local edge + embedded store
                                 (--local-edge=false --db postgres://… for control-plane replicas)
  dsec edge --join URL --token T a node joining a control plane (the edge API over TCP)

Client side (DSEC_URL, DSEC_API_KEY or --url, --key):
  dsec sandbox create|ls|get|rm|exec|shell|logs|port-forward|vnc|cp|reset|pause|resume|renew|
               snapshot|fork|screenshot|input
  dsec trajectory get|rm|restore
  dsec layer build|import|ls|get|record-prefetch
  dsec tenant create|ls|get|quota
  dsec key create|ls|rm
  dsec fncall [flags] -- CMD...    one call on a warm pool; also: dsec fncall pools|warm
  dsec node ls|get|drain|undrain
  dsec swerex create [--base …]   a sandbox for SWE-agent's RemoteDeployment; prints its host URL
  dsec bench create|exec|density|fork|reset|seccomp|fncall|runcode|batch|trajectory|image|
             microvm|fullvm|cluster|soak|chaos

Run "dsec COMMAND -h" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	var ee exitError
	switch {
	case errors.As(err, &ee):
		os.Exit(int(ee))
	case errors.Is(err, flag.ErrHelp) && helpAsked(os.Args[1:]):
		os.Exit(0)
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "dsec:", err)
		os.Exit(1)
	}
}

// exitError carries a command's exit code out of `dsec sandbox exec`.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return flag.ErrHelp
	}
	cmd, rest := args[0], args[1:]
	if cmd == "help" && len(rest) > 0 {
		// dsec help X [Y]: what dsec X [Y] --help prints.
		return run(ctx, append(slices.Clone(rest), "--help"))
	}
	if g := groups[cmd]; g != nil && len(rest) > 0 && isHelpFlag(rest[0]) {
		return groupUsage(ctx, cmd, g)
	}
	switch cmd {
	case "server":
		return serverCmd(ctx, rest)
	case "edge":
		return edgeCmd(ctx, rest)
	case "blobfs":
		return blobfsCmd(ctx, rest)
	case "sandbox", "sb":
		return sandboxCmd(ctx, rest)
	case "layer":
		return layerCmd(ctx, rest)
	case "trajectory", "traj":
		return trajectoryCmd(ctx, rest)
	case "tenant":
		return tenantCmd(ctx, rest)
	case "key":
		return keyCmd(ctx, rest)
	case "node":
		return nodeCmd(ctx, rest)
	case "fncall":
		return fncallCmd(ctx, rest)
	case "bench":
		return benchCmd(ctx, rest)
	case "swerex":
		return swerexCmd(ctx, rest)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return nil
	}
	fmt.Fprint(os.Stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

// clientFlags adds --url and --key to a flag set and returns a function
// that builds the client once flags are parsed.
func clientFlags(fs *flag.FlagSet) func() *client.Client {
	url := fs.String("url", envOr("DSEC_URL", "http://127.0.0.1:7070"), "server URL ($DSEC_URL)")
	key := fs.String("key", os.Getenv("DSEC_API_KEY"), "API key ($DSEC_API_KEY); default: the admin key in ./.dsec or /var/lib/dsec")
	return func() *client.Client {
		k := *key
		if k == "" {
			k = localAdminKey()
		}
		return client.New(*url, k)
	}
}

// localAdminKey reads the all-in-one server's admin key when the CLI runs
// on the same machine, so that a newcomer's first commands just work.
func localAdminKey() string {
	for _, p := range []string{defaultDataDir() + "/admin.key", "/var/lib/dsec/admin.key"} {
		if b, err := os.ReadFile(p); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// parseArgs parses flags that may come before or between positional
// arguments; everything after a "--" is returned as rest, untouched.
func parseArgs(fs *flag.FlagSet, args []string) (pos, rest []string, err error) {
	if i := slices.Index(args, "--"); i >= 0 {
		args, rest = args[:i], args[i+1:]
	}
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, rest, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// keyValues parses k=v flags into a map.
func keyValues(list []string, what string) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range list {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE", what, kv)
		}
		m[k] = v
	}
	return m, nil
}

func printErrorCode(err error) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return fmt.Errorf("%s (%s)", ae.Message, ae.Code)
	}
	return err
}

// groups are the commands that take a subcommand. Called without one,
// each returns its usage as an error.
var groups = map[string]func(context.Context, []string) error{
	"sandbox": sandboxCmd, "sb": sandboxCmd, "layer": layerCmd, "trajectory": trajectoryCmd,
	"traj": trajectoryCmd, "tenant": tenantCmd, "key": keyCmd, "node": nodeCmd, "bench": benchCmd,
	"swerex": swerexCmd,
}

// groupUsage prints a command group's usage, for dsec X --help.
func groupUsage(ctx context.Context, name string, g func(context.Context, []string) error) error {
	err := g(ctx, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "usage: ") {
		return err
	}
	fmt.Printf("%s\n\nRun \"dsec %s SUBCOMMAND -h\" for a subcommand's flags.\n", err, name)
	return nil
}

func isHelpFlag(a string) bool { return a == "-h" || a == "-help" || a == "--help" || a == "help" }

// helpAsked reports whether the command line asked for help (and so exits
// 0 once the usage is printed), rather than being wrong.
func helpAsked(args []string) bool {
	if len(args) > 0 && args[0] == "help" || len(args) > 1 && groups[args[0]] != nil && args[1] == "help" {
		return true
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		if isHelpFlag(a) && a != "help" {
			return true
		}
	}
	return false
}
