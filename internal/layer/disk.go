package layer

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/vmimage"
)

// ImportDisk stores a disk image (a vm layer: qcow2, or a raw disk) as a
// whole-image layer, the image as the metadata part, as ImportImage does
// for EROFS. At most limit bytes are read. Whether the disk boots is
// found out by the node that first boots it.
func (s *Store) ImportDisk(ctx context.Context, r io.Reader, limit int64) (Desc, error) {
	f, err := os.CreateTemp(s.tmpDir, "import-*.disk")
	if err != nil {
		return Desc{}, fmt.Errorf("import vm layer: %w", err)
	}
	defer os.Remove(f.Name())
	n, err := copyContext(ctx, f, io.LimitReader(r, limit+1), make([]byte, 1<<20))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Desc{}, fmt.Errorf("import vm layer: %w", err)
	}
	if n > limit {
		return Desc{}, fmt.Errorf("import vm layer: image larger than %d bytes: %w", limit, errdefs.ErrTooLarge)
	}
	return s.PutDisk(ctx, f.Name())
}

// PutDisk stores the disk image at path as a whole-image layer.
func (s *Store) PutDisk(ctx context.Context, path string) (Desc, error) {
	f, err := os.Open(path)
	if err != nil {
		return Desc{}, fmt.Errorf("vm layer: %w", err)
	}
	head := make([]byte, 4096)
	n, _ := f.ReadAt(head, 0)
	f.Close()
	if _, err := vmimage.DetectFormat(head[:n]); err != nil {
		return Desc{}, err
	}
	d, err := s.putFiles(ctx, path, "")
	if err != nil {
		return Desc{}, fmt.Errorf("vm layer: %w", err)
	}
	return d, nil
}
