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
)

func tenantCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: dsec tenant create NAME | ls | get ID | quota ID [--sandboxes N] [--cpu C] [--memory-mb M]")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("dsec tenant "+sub, flag.ContinueOnError)
	newClient := clientFlags(fs)
	var q api.Quota
	fs.Int64Var(&q.Sandboxes, "sandboxes", 0, "quota: live sandboxes (0 unlimited)")
	fs.Float64Var(&q.CPU, "cpu", 0, "quota: CPU cores requested by live sandboxes (0 unlimited)")
	fs.Int64Var(&q.MemoryMB, "memory-mb", 0, "quota: memory requested by live sandboxes, MB (0 unlimited)")
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
	case "get", "quota":
		if len(pos) != 1 {
			return errors.New("usage: dsec tenant get ID | quota ID [--sandboxes N] [--cpu C] [--memory-mb M]")
		}
		c := newClient()
		var t *api.Tenant
		if sub == "quota" {
			t, err = c.SetQuota(ctx, pos[0], q)
		} else {
			t, err = c.GetTenant(ctx, pos[0])
		}
		if err != nil {
			return printErrorCode(err)
		}
		return printJSON(t)
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
	if len(args) == 0 {
		return errors.New("usage: dsec node ls | get ID | drain ID | undrain ID")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("dsec node "+sub, flag.ContinueOnError)
	newClient := clientFlags(fs)
	pos, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch sub {
	case "ls", "list":
		nl, err := newClient().NodeList(ctx)
		if err != nil {
			return printErrorCode(err)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tPOOL\tSANDBOXES\tCPU (ALLOC/LIMIT)\tCPU USED\tMEMORY MB (ALLOC/CAP)\tMEMORY USED\tDISK MB (ALLOC/LIMIT)\tDISK USED\tLAST SEEN")
		for _, n := range nl.Nodes {
			pool := n.Pool
			if pool == "" {
				pool = "-"
			}
			state := n.State
			if n.Busy {
				state += " (busy)"
			}
			if n.Load.DiskFull {
				state += " (disk full)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%g/%g\t%.2f\t%d/%d\t%d\t%d/%d\t%d\t%s\n", n.ID, state, pool, n.Sandboxes,
				n.Allocated.CPU, n.Limit.CPU, n.Load.CPU, n.Allocated.MemoryMB, n.Capacity.MemoryMB, n.Load.MemoryMB,
				n.Allocated.DiskMB, n.Limit.DiskMB, n.Load.DiskUsedMB, time.Since(n.LastSeen).Round(time.Second))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, n := range nl.Nodes {
			if p := n.Load.BlankPool; p != nil {
				fmt.Printf("%s: blank sandbox pool %d ready (target %d, max %d); %d creates claimed one, %d missed\n",
					n.ID, p.Size, p.Target, p.Max, p.Claims, p.Misses)
			}
		}
		if a := nl.Admission; a != nil {
			fmt.Printf("admission queue: %d creates waiting for busy nodes (%d tenants, oldest %s); since start %d admitted after waiting, %d timed out, %d left\n",
				a.Waiting, a.Tenants, (time.Duration(a.OldestWaitMs) * time.Millisecond).Round(time.Millisecond/10), a.Admitted, a.TimedOut, a.Left)
		}
		return nil
	case "get", "drain", "undrain":
		if len(pos) != 1 {
			return fmt.Errorf("usage: dsec node %s ID", sub)
		}
		var n *api.Node
		if sub == "get" {
			n, err = newClient().GetNode(ctx, pos[0])
		} else {
			n, err = newClient().DrainNode(ctx, pos[0], sub == "drain")
		}
		if err != nil {
			return printErrorCode(err)
		}
		return printJSON(n)
	}
	return fmt.Errorf("unknown command: dsec node %s", sub)
}
