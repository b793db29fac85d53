package layer_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/testutil"
)

func TestParseDigest(t *testing.T) {
	hex64 := strings.Repeat("0123456789abcdef", 4)
	tests := []struct {
		in      string
		wantHex string
	}{
		{"sha256:" + hex64, hex64},
		{hex64, ""},
		{"sha256:" + strings.ToUpper(hex64), ""},
		{"sha256:" + hex64[:63], ""},
		{"sha256:" + hex64 + "0", ""},
		{"sha512:" + hex64, ""},
		{"sha256:" + hex64[:63] + "g", ""},
		{"sha256:../../../../etc/passwd", ""},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := layer.ParseDigest(tt.in)
			if tt.wantHex == "" {
				if !errors.Is(err, errdefs.ErrInvalid) {
					t.Errorf("ParseDigest = %q, %v; want ErrInvalid", got, err)
				}
				return
			}
			if err != nil || got != tt.wantHex {
				t.Errorf("ParseDigest = %q, %v; want %q", got, err, tt.wantHex)
			}
		})
	}
}

func TestFromTar(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	s := newChunkStore(t)
	tmpRoot := t.TempDir()
	tests := []struct {
		name    string
		tarball []byte
		want    error
	}{
		{"layer", faithfulTar(t).Bytes(), nil},
		{"hostile tar", tarOf(t, file("../x", "")).Bytes(), errdefs.ErrInvalid},
		{"too large", tarOf(t, file("big", strings.Repeat("x", 100))).Bytes(), errdefs.ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := layer.FromTar(ctx, bytes.NewReader(tt.tarball), s, tmpRoot, layer.Limits{MaxBytes: 99})
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Errorf("err = %v, want %v", err, tt.want)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				// The same tar built by hand gives the stored digest.
				want, err := s.Build(ctx, extract(t, tt.tarball))
				if err != nil || d.Digest != want.Digest {
					t.Errorf("FromTar = %+v, Build = %+v, %v", d, want, err)
				}
				if _, _, err := s.Manifest(ctx, d.Digest); err != nil {
					t.Error(err)
				}
			}
			if left, _ := os.ReadDir(tmpRoot); len(left) != 0 {
				t.Errorf("left behind in tmpRoot: %v", left)
			}
		})
	}
}
