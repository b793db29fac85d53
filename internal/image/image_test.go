package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/dsec-project/dsec/internal/image"
)

func layerOf(t *testing.T, files map[string]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg})
		tw.Write([]byte(files[n]))
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage has two layers; the second replaces one file and deletes
// another with an OCI whiteout.
func testImage(t *testing.T) v1.Image {
	img, err := mutate.AppendLayers(empty.Image,
		layerOf(t, map[string]string{"etc/os": "one", "bin/tool": "tool", "gone": "x"}),
		layerOf(t, map[string]string{"etc/os": "two", ".wh.gone": ""}),
	)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func contents(t *testing.T, rc io.ReadCloser) map[string]string {
	t.Helper()
	defer rc.Close()
	out := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out[strings.TrimPrefix(h.Name, "/")] = string(b)
	}
}

func TestFlatten(t *testing.T) {
	ctx := context.Background()
	img := testImage(t)
	dir := t.TempDir()

	archive := filepath.Join(dir, "img.tar")
	tag, _ := name.NewTag("example.com/test:1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	oci := filepath.Join(dir, "oci")
	p, err := layout.Write(oci, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	reg := httptest.NewServer(registry.New())
	defer reg.Close()
	ref := strings.TrimPrefix(reg.URL, "http://") + "/team/img:v1"
	r, _ := name.ParseReference(ref, name.Insecure)
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}

	want := map[string]string{"etc/os": "two", "bin/tool": "tool"}
	for _, src := range []string{"docker-archive:" + archive, "oci:" + oci + ":v1", "oci:" + oci, "docker://" + ref} {
		t.Run(src[:strings.Index(src, ":")], func(t *testing.T) {
			rc, err := image.Flatten(ctx, src, image.Options{Insecure: true})
			if err != nil {
				t.Fatal(err)
			}
			got := contents(t, rc)
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
			if _, ok := got["gone"]; ok {
				t.Errorf("whited-out file still there: %v", got)
			}
		})
	}
	for _, bad := range []string{"nope", "oci:" + oci + ":v9", "docker-archive:/nonexistent", "ftp:x"} {
		if _, err := image.Flatten(ctx, bad, image.Options{}); err == nil {
			t.Errorf("Flatten(%q) succeeded", bad)
		}
	}
}
