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
