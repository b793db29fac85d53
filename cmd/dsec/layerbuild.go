package main

import (
	"archive/tar"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// hasFlag reports whether args set the flag --name (or -name).
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		a = strings.TrimLeft(a, "-")
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// dockerfileBuild is `dsec layer build --dockerfile PATH [--context DIR]
// --name NAME:TAG`: the context goes up as a tar (with the Dockerfile),
// and each step is printed as the server runs it.
func dockerfileBuild(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	var o client.BuildOptions
	var buildArgs stringList
	dockerfile := fs.String("dockerfile", "", "the Dockerfile")
	dir := fs.String("context", "", "the build context (default: the Dockerfile's directory)")
	fs.StringVar(&o.Name, "name", "", "NAME:TAG of the result")
	fs.BoolVar(&o.Flatten, "flatten", false, "squash the result into one layer of --kind (default: a snapshot on the stack of its steps, created from with --snapshot)")
	fs.StringVar(&o.Kind, "kind", "", "with --flatten: base (default), workspace or toolkit")
	fs.StringVar(&o.Network, "network", "none", "network of the RUN steps: none or open")
	fs.Var(&buildArgs, "build-arg", "KEY=VALUE build argument (repeatable)")
	quiet := fs.Bool("quiet", false, "print no RUN output")
	if _, _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if *dockerfile == "" || o.Name == "" {
		return fmt.Errorf("usage: dsec layer build --dockerfile PATH [--context DIR] --name NAME:TAG")
	}
	o.Args = buildArgs
	if *dir == "" {
		*dir = filepath.Dir(*dockerfile)
	}
	df, err := os.ReadFile(*dockerfile)
	if err != nil {
		return err
	}
	// The Dockerfile rides in the context under a name of its own.
	o.Dockerfile = ".dsec-build/Dockerfile"
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := tw.WriteHeader(&tar.Header{Name: o.Dockerfile, Mode: 0o644, Size: int64(len(df)), Typeflag: tar.TypeReg})
		if err == nil {
			_, err = tw.Write(df)
		}
		if err == nil {
			err = writeTarTo(tw, *dir)
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	defer pr.Close()
	start := time.Now()
	res, err := newClient().BuildLayer(ctx, o, pr, func(ev api.BuildEvent) {
		switch {
		case ev.Step != nil && !ev.Step.Done:
			fmt.Fprintf(os.Stderr, "[%d/%d] line %d: %s\n", ev.Step.Index, ev.Step.Total, ev.Step.Line, ev.Step.Instruction)
		case ev.Step != nil && ev.Step.Cached:
			fmt.Fprintf(os.Stderr, "[%d/%d] cached\n", ev.Step.Index, ev.Step.Total)
		case ev.Step != nil:
			fmt.Fprintf(os.Stderr, "[%d/%d] done in %s\n", ev.Step.Index, ev.Step.Total,
				(time.Duration(ev.Step.DurationMs) * time.Millisecond).Round(time.Millisecond))
		case ev.Output != nil && !*quiet:
			fmt.Fprint(os.Stderr, indent(ev.Output.Data))
		}
	})
	if err != nil {
		if be, ok := err.(*client.BuildError); ok {
			if be.Output != "" && *quiet {
				fmt.Fprint(os.Stderr, indent(be.Output))
			}
			return fmt.Errorf("%s (%s)", be.Message, be.Code)
		}
		return printErrorCode(err)
	}
	how := "create with --snapshot " + res.Layer.Ref
	if res.Layer.Kind != api.KindSnapshot {
		how = fmt.Sprintf("a %s layer", res.Layer.Kind)
	}
	fmt.Fprintf(os.Stderr, "built %s in %s: %d steps, %d cached; %s\n", res.Layer.Ref,
		time.Since(start).Round(time.Millisecond), res.Steps, res.CachedSteps, how)
	fmt.Println(res.Layer.Ref)
	return nil
}

func indent(s string) string {
	lines := strings.SplitAfter(s, "\n")
	var b strings.Builder
	for _, l := range lines {
		if l != "" {
			b.WriteString("    " + l)
		}
	}
	return b.String()
}
