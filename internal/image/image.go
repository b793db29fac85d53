// Package image reads OCI and Docker images — a docker-archive tarball
// (docker save), an OCI image layout directory, or a registry — and
// flattens one into a single filesystem tar stream: every layer applied in
// order, whiteouts resolved, which package layer then builds into one base
// layer. It must never write anywhere: the stream is the only output.
package image

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// Options tune how an image is read.
type Options struct {
	// Insecure lets a registry be reached over plain HTTP.
	Insecure bool
	// Platform picks one image of a multi-platform index; linux and this
	// machine's architecture by default.
	Platform *v1.Platform
}

// Source forms:
//
//	docker-archive:PATH[:REPO:TAG]   a `docker save` tarball
//	oci:DIR[:REF]                    an OCI image layout (REF: the
//	                                 org.opencontainers.image.ref.name)
//	docker://REF                     a registry, e.g. docker://host:5000/img:tag
const sourceHelp = "want docker-archive:PATH, oci:DIR[:REF] or docker://REGISTRY/REPO:TAG"

// Open resolves src to an image.
func Open(ctx context.Context, src string, opts Options) (v1.Image, error) {
	if opts.Platform == nil {
		opts.Platform = &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	}
	kind, rest, ok := strings.Cut(src, ":")
	if !ok || rest == "" {
		return nil, errdefs.Invalid("image source %q: %s", src, sourceHelp)
	}
	switch kind {
	case "docker-archive":
		path, tag, _ := strings.Cut(rest, ":")
		var t *name.Tag
		if tag != "" {
			nt, err := name.NewTag(tag)
			if err != nil {
				return nil, errdefs.Invalid("image tag %q: %v", tag, err)
			}
			t = &nt
		}
		img, err := tarball.ImageFromPath(path, t)
		if err != nil {
			return nil, fmt.Errorf("read docker archive %s: %w", path, err)
		}
		return img, nil
	case "oci":
		dir, ref, _ := strings.Cut(rest, ":")
		return fromLayout(dir, ref, opts)
	case "docker":
		ref := strings.TrimPrefix(rest, "//")
		var nopts []name.Option
		if opts.Insecure {
			nopts = append(nopts, name.Insecure)
		}
		r, err := name.ParseReference(ref, nopts...)
		if err != nil {
			return nil, errdefs.Invalid("image reference %q: %v", ref, err)
		}
		img, err := remote.Image(r, remote.WithContext(ctx), remote.WithPlatform(*opts.Platform))
		if err != nil {
			return nil, fmt.Errorf("pull %s: %w", ref, err)
		}
		return img, nil
	}
	return nil, errdefs.Invalid("image source %q: %s", src, sourceHelp)
}

// fromLayout picks the image named ref (or the only one) in an OCI
// layout, descending into a multi-platform index.
func fromLayout(dir, ref string, opts Options) (v1.Image, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w", dir, err)
	}
	return pick(idx, ref, opts, dir)
}

func pick(idx v1.ImageIndex, ref string, opts Options, where string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read index of %s: %w", where, err)
	}
	var cands []v1.Descriptor
	for _, d := range im.Manifests {
		if ref != "" && d.Annotations["org.opencontainers.image.ref.name"] != ref {
			continue
		}
		if d.Platform != nil && !d.Platform.Satisfies(*opts.Platform) {
			continue
		}
		cands = append(cands, d)
	}
	if len(cands) != 1 {
		return nil, errdefs.Invalid("%s holds %d images matching %q for %s/%s: name one", where, len(cands), ref,
			opts.Platform.OS, opts.Platform.Architecture)
	}
	d := cands[0]
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		return pick(child, "", opts, where)
	}
	return idx.Image(d.Digest)
}

// Flatten returns the image's filesystem as one tar stream: its layers
// applied in order, whiteouts resolved. The caller closes it.
func Flatten(ctx context.Context, src string, opts Options) (io.ReadCloser, error) {
	img, err := Open(ctx, src, opts)
	if err != nil {
		return nil, err
	}
	return mutate.Extract(img), nil
}
