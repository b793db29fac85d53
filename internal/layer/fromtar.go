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
// temporary directory under tmpRoot and builds a chunked layer of it into
// the store. The temporary tree is removed whatever happens.
func FromTar(ctx context.Context, r io.Reader, store *Store, tmpRoot string, lim Limits) (d Desc, err error) {
	work, err := os.MkdirTemp(tmpRoot, "layer-")
	if err != nil {
		return Desc{}, fmt.Errorf("layer from tar: %w", err)
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
		return Desc{}, fmt.Errorf("layer from tar: %w", err)
	}
	if err := unix.Chmod(rootfs, 0o755); err != nil {
		return Desc{}, fmt.Errorf("layer from tar: %w", err)
	}
	if _, err := ExtractTar(ctx, r, rootfs, lim); err != nil {
		return Desc{}, fmt.Errorf("layer from tar: %w", err)
	}

	d, err = store.Build(ctx, rootfs)
	if err != nil {
		return Desc{}, fmt.Errorf("layer from tar: %w", err)
	}
	return d, nil
}
