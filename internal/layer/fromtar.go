package layer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// FromTar turns a tar stream into a stored layer: it extracts r into a
// temporary directory under tmpRoot, builds the image straight into the
// store, and commits it. The temporary tree is removed whatever happens.
func FromTar(ctx context.Context, r io.Reader, store *LocalStore, tmpRoot string, lim Limits) (img Image, err error) {
	work, err := os.MkdirTemp(tmpRoot, "layer-")
	if err != nil {
		return Image{}, fmt.Errorf("layer from tar: %w", err)
	}
	defer func() {
		if rerr := os.RemoveAll(work); rerr != nil {
			err = errors.Join(err, fmt.Errorf("layer from tar: remove %s: %w", work, rerr))
		}
	}()
	// The image's root directory, unless the tar has a "./" entry: 0755
	// whatever the umask, so the image depends on the tar alone.
	rootfs := filepath.Join(work, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Image{}, fmt.Errorf("layer from tar: %w", err)
	}
	if err := unix.Chmod(rootfs, 0o755); err != nil {
		return Image{}, fmt.Errorf("layer from tar: %w", err)
	}
	if _, err := ExtractTar(ctx, r, rootfs, lim); err != nil {
		return Image{}, fmt.Errorf("layer from tar: %w", err)
	}

	out, err := os.CreateTemp(store.tmpDir(), "build-*.erofs")
	if err != nil {
		return Image{}, fmt.Errorf("layer from tar: %w", err)
	}
	out.Close()
	img, err = Build(ctx, rootfs, out.Name())
	if err == nil {
		err = store.adopt(out.Name(), img)
	}
	if err != nil {
		os.Remove(out.Name())
		return Image{}, fmt.Errorf("layer from tar: %w", err)
	}
	return img, nil
}
