package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/image"
)

// layerSource is where `dsec layer build` takes a layer from, besides a
// directory or file given as an argument.
type layerSource struct {
	image       string
	insecure    bool
	debootstrap string
	include     string
	mirror      string
	git         string
	prefix      string
	keep        string
}

func (s *layerSource) register(fs *flag.FlagSet) {
	fs.StringVar(&s.image, "image", "", "an OCI/Docker image, flattened: docker-archive:PATH, oci:DIR[:REF] or docker://REGISTRY/REPO:TAG")
	fs.BoolVar(&s.insecure, "insecure-registry", false, "reach the --image registry over plain HTTP")
	fs.StringVar(&s.debootstrap, "debootstrap", "", "a Debian suite (e.g. bookworm) installed with debootstrap (run as root)")
	fs.StringVar(&s.include, "include", "", "with --debootstrap: extra packages, comma-separated")
	fs.StringVar(&s.mirror, "mirror", image.DefaultMirror, "with --debootstrap: the Debian mirror")
	fs.StringVar(&s.git, "git", "", "a git repository (path or URL, @REV to pick a revision) cloned as a workspace")
	fs.StringVar(&s.prefix, "prefix", "/work/repo", "with --git: where the repository goes in the sandbox")
	fs.StringVar(&s.keep, "keep-rootfs", "", "with --debootstrap or --git: also keep the tree in this new directory")
}

func (s *layerSource) count() int {
	n := 0
	for _, v := range []string{s.image, s.debootstrap, s.git} {
		if v != "" {
			n++
		}
	}
	return n
}

// build makes the tree (or tar stream) and uploads it.
func (s *layerSource) build(ctx context.Context, c *client.Client, kind, name string, public bool) error {
	if s.image != "" {
		rc, err := image.Flatten(ctx, s.image, image.Options{Insecure: s.insecure})
		if err != nil {
			return err
		}
		defer rc.Close()
		return upload(ctx, c, kind, name, s.image, rc, public)
	}
	if os.Geteuid() != 0 {
		return errors.New("building a tree with --debootstrap or --git keeps owners and device nodes: run as root")
	}
	dir := s.keep
	if dir == "" {
		tmp, err := os.MkdirTemp("", "dsec-layer-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	} else if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	switch {
	case s.debootstrap != "":
		var include []string
		if s.include != "" {
			include = strings.Split(s.include, ",")
		}
		fmt.Fprintf(os.Stderr, "debootstrap %s (+%s) from %s into %s\n", s.debootstrap, s.include, s.mirror, dir)
		if err := image.Debootstrap(ctx, s.debootstrap, include, s.mirror, dir); err != nil {
			return err
		}
	default:
		repo, rev := s.git, ""
		// REPO@REV, where REV holds no '/' or ':' (git@host:path is a repo).
		if i := strings.LastIndexByte(s.git, '@'); i > 0 && !strings.ContainsAny(s.git[i+1:], "/:") {
			repo, rev = s.git[:i], s.git[i+1:]
		}
		if err := image.GitWorkspace(ctx, repo, rev, dir, s.prefix); err != nil {
			return err
		}
	}
	return layerBuild(ctx, c, kind, name, dir, public)
}

// upload sends a tar stream as a layer, with progress.
func upload(ctx context.Context, c *client.Client, kind, name, what string, r io.Reader, public bool) error {
	pr := &progressReader{r: r}
	stop := pr.report(os.Stderr, "uploading "+what)
	l, err := c.CreateLayer(ctx, kind, name, pr, public)
	stop()
	if err != nil {
		return printErrorCode(err)
	}
	fmt.Fprintf(os.Stderr, "layer %s (%s, %s) %s\n", l.Ref, l.Kind, humanBytes(l.Size), l.Digest)
	fmt.Println(l.Ref)
	return nil
}
