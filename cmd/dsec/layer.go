package main

import (
	"archive/tar"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dsec-project/dsec/client"
)

func layerCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: dsec layer build|import|ls|get|record-prefetch")
	}
	sub, args := args[0], args[1:]
	if sub == "record-prefetch" {
		return layerRecordPrefetch(ctx, args)
	}
	fs := flag.NewFlagSet("dsec layer "+sub, flag.ContinueOnError)
	newClient := clientFlags(fs)
	switch sub {
	case "build", "import":
		if sub == "build" && hasFlag(args, "dockerfile") {
			return dockerfileBuild(ctx, fs, newClient, args)
		}
		kind := fs.String("kind", "base", "base, workspace or toolkit")
		name := fs.String("name", "", "NAME:TAG")
		public := fs.Bool("public", false, "visible to every tenant (admin only)")
		var src layerSource
		src.register(fs)
		pos, _, err := parseArgs(fs, args)
		if err != nil {
			return err
		}
		if *name == "" || len(pos)+src.count() != 1 {
			return fmt.Errorf("usage: dsec layer %s --kind K --name NAME:TAG (DIR|TAR|EROFS | --image SRC | --debootstrap SUITE | --git REPO)", sub)
		}
		if len(pos) == 1 {
			return layerBuild(ctx, newClient(), *kind, *name, pos[0], *public)
		}
		return src.build(ctx, newClient(), *kind, *name, *public)
	case "ls", "list":
		if _, _, err := parseArgs(fs, args); err != nil {
			return err
		}
		ls, err := newClient().ListLayers(ctx)
		if err != nil {
			return printErrorCode(err)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "REF\tKIND\tSIZE\tPUBLIC\tDIGEST")
		for _, l := range ls {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\n", l.Ref, l.Kind, humanBytes(l.Size), l.Public, l.Digest)
		}
		return tw.Flush()
	case "get":
		pos, _, err := parseArgs(fs, args)
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			return errors.New("usage: dsec layer get REF")
		}
		l, err := newClient().GetLayer(ctx, pos[0])
		if err != nil {
			return printErrorCode(err)
		}
		return printJSON(l)
	}
	return fmt.Errorf("unknown command: dsec layer %s", sub)
}

// layerBuild uploads a directory (as a tar stream made on the fly), a tar
// file or an EROFS image; the server builds and stores the layer.
func layerBuild(ctx context.Context, c *client.Client, kind, name, src string, public bool) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	var r io.Reader
	if st.IsDir() {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeTar(pw, src)) }()
		defer pr.Close()
		r = pr
	} else {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	pr := &progressReader{r: r}
	stop := pr.report(os.Stderr, "uploading "+src)
	l, err := c.CreateLayer(ctx, kind, name, pr, public)
	stop()
	if err != nil {
		return printErrorCode(err)
	}
	fmt.Fprintf(os.Stderr, "layer %s (%s, %s) %s\n", l.Ref, l.Kind, humanBytes(l.Size), l.Digest)
	fmt.Println(l.Ref)
	return nil
}

// writeTar writes dir as a tar stream with numeric owners, so that a layer
// built by a user keeps the ownership the files have.
func writeTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	if err := writeTarTo(tw, dir); err != nil {
		return err
	}
	return tw.Close()
}

// writeTarTo writes dir's entries to tw.
func writeTarTo(tw *tar.Writer, dir string) error {
	links := map[[2]uint64]string{}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var target string
		if info.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, target)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		hdr.Uname, hdr.Gname = "", ""
		if sys, ok := info.Sys().(*syscall.Stat_t); ok {
			hdr.Uid, hdr.Gid = int(sys.Uid), int(sys.Gid)
			if info.Mode().IsRegular() && sys.Nlink > 1 {
				key := [2]uint64{sys.Dev, sys.Ino}
				if first, seen := links[key]; seen {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				} else {
					links[key] = hdr.Name
				}
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
}

// progressReader counts bytes read and reports them while a long upload
// runs.
type progressReader struct {
	r io.Reader
	n atomic.Int64
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n.Add(int64(n))
	return n, err
}

// report prints progress to w every second until stop is called.
func (p *progressReader) report(w io.Writer, what string) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		start := time.Now()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(w, "%s: %s sent in %s\n", what, humanBytes(p.n.Load()), time.Since(start).Round(time.Second))
			}
		}
	}()
	return func() { close(done); <-finished }
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
