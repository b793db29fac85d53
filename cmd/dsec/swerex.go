package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// swerexCmd is dsec swerex: the launcher SWE-agent needs, since its
// RemoteDeployment attaches to a running SWE-ReX server and cannot create
// a dsec sandbox itself.
func swerexCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: dsec swerex create")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("dsec swerex "+sub, flag.ContinueOnError)
	newClient := clientFlags(fs)
	switch sub {
	case "create":
		return swerexCreate(ctx, fs, newClient, args)
	}
	return fmt.Errorf("unknown command \"swerex %s\" (usage: dsec swerex create)", sub)
}

// swerexCreate creates a sandbox and prints the host URL that SWE-ReX's
// RemoteRuntime (SWE-agent's RemoteDeployment, port unset) takes to drive
// it: URL/swerex/ID.
func swerexCreate(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	req := api.CreateSandboxRequest{Layers: &api.LayerRefs{}}
	var labels, env stringList
	fs.StringVar(&req.Backend, "backend", "", "container (default), microvm, fullvm")
	fs.StringVar(&req.Layers.Base, "base", "base:minimal", "base layer ref (an image with bash; base:minimal's sessions run busybox sh)")
	fs.StringVar(&req.Layers.Workspace, "workspace", "", "workspace layer ref (the repository)")
	fs.StringVar(&req.Layers.Toolkit, "toolkit", "", "toolkit layer ref")
	fs.Float64Var(&req.Resources.CPU, "cpu", 0, "CPU cores")
	fs.Int64Var(&req.Resources.MemoryMB, "memory", 0, "memory limit, MB")
	ttl := fs.Duration("ttl", 0, "lease, renewable with dsec sandbox renew (default: the server's)")
	idle := fs.Duration("idle-timeout", 0, "destroy it after this long without API activity (default: the server's)")
	fs.Var(&labels, "label", "KEY=VALUE label (repeatable)")
	fs.Var(&env, "env", "KEY=VALUE environment variable (repeatable)")
	if _, _, err := parseArgs(fs, args); err != nil {
		return err
	}
	req.TTLSeconds = int64(ttl.Seconds())
	req.IdleTimeoutSeconds = int64(idle.Seconds())
	var err error
	if req.Labels, err = keyValues(labels, "label"); err != nil {
		return err
	}
	if req.Env, err = keyValues(env, "env"); err != nil {
		return err
	}
	sb, err := newClient().CreateSandbox(ctx, &req)
	if err != nil {
		return printErrorCode(err)
	}
	host := strings.TrimSuffix(fs.Lookup("url").Value.String(), "/") + "/swerex/" + sb.ID
	fmt.Println(host)
	fmt.Fprintf(os.Stderr, "SWE-agent: --env.deployment.type=remote --env.deployment.host=%s --env.deployment.auth_token=$DSEC_API_KEY\n"+
		"(dsec sandbox rm %s when done: the deployment's stop only closes its sessions)\n", host, sb.ID)
	return nil
}
