package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"
)

func tenantCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: dsec tenant create NAME | ls")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("dsec tenant "+sub, flag.ContinueOnError)
	newClient := clientFlags(fs)
	pos, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch sub {
	case "create":
		if len(pos) != 1 {
			return errors.New("usage: dsec tenant create NAME")
		}
		t, err := newClient().CreateTenant(ctx, pos[0])
		if err != nil {
			return printErrorCode(err)
		}
		fmt.Println(t.ID)
		return nil
	case "ls", "list":
		ts, err := newClient().ListTenants(ctx)
		if err != nil {
			return printErrorCode(err)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tCREATED")
		for _, t := range ts {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", t.ID, t.Name, t.CreatedAt.Local().Format(time.DateTime))
		}
		return tw.Flush()
	}
	return fmt.Errorf("unknown command: dsec tenant %s", sub)
}

func keyCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: dsec key create --tenant ID [--admin] | ls --tenant ID | rm ID")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("dsec key "+sub, flag.ContinueOnError)
	newClient := clientFlags(fs)
	tenant := fs.String("tenant", "", "tenant id")
	admin := fs.Bool("admin", false, "an admin key")
	pos, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch sub {
	case "create":
		if *tenant == "" {
			return errors.New("usage: dsec key create --tenant ID [--admin]")
		}
		k, err := newClient().CreateKey(ctx, *tenant, *admin)
		if err != nil {
			return printErrorCode(err)
		}
		fmt.Println(k.Secret)
		return nil
	case "ls", "list":
		if *tenant == "" {
			return errors.New("usage: dsec key ls --tenant ID")
		}
		ks, err := newClient().ListKeys(ctx, *tenant)
		if err != nil {
			return printErrorCode(err)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tADMIN\tCREATED")
		for _, k := range ks {
			fmt.Fprintf(tw, "%s\t%v\t%s\n", k.ID, k.Admin, k.CreatedAt.Local().Format(time.DateTime))
		}
		return tw.Flush()
	case "rm", "delete":
		if len(pos) != 1 {
			return errors.New("usage: dsec key rm ID")
		}
		return printErrorCode(newClient().DeleteKey(ctx, pos[0]))
	}
	return fmt.Errorf("unknown command: dsec key %s", sub)
}

func nodeCmd(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "ls" && args[0] != "list") {
		return errors.New("usage: dsec node ls")
	}
	fs := flag.NewFlagSet("dsec node ls", flag.ContinueOnError)
	newClient := clientFlags(fs)
	if _, _, err := parseArgs(fs, args[1:]); err != nil {
		return err
	}
	ns, err := newClient().ListNodes(ctx)
	if err != nil {
		return printErrorCode(err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tSANDBOXES\tCPU (ALLOC/CAP)\tMEMORY MB (ALLOC/CAP)\tBACKENDS")
	for _, n := range ns {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%g/%g\t%d/%d\t%v\n", n.ID, n.State, n.Sandboxes,
			n.Allocated.CPU, n.Capacity.CPU, n.Allocated.MemoryMB, n.Capacity.MemoryMB, n.Backends)
	}
	return tw.Flush()
}
