package layer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
)

const digestPrefix = "sha256:"

// ParseDigest checks that s is "sha256:" and 64 lowercase hex digits, and
// returns the hex part.
func ParseDigest(s string) (string, error) {
	h, ok := strings.CutPrefix(s, digestPrefix)
	if !ok || len(h) != 2*sha256.Size || strings.IndexFunc(h, notLowerHex) >= 0 {
		return "", errdefs.Invalid("digest %q: want sha256: and 64 lowercase hex digits", s)
	}
	return h, nil
}

func notLowerHex(r rune) bool {
	return !('0' <= r && r <= '9' || 'a' <= r && r <= 'f')
}

// DefaultMaxImportSize bounds an uploaded image when the store sets no
// limit of its own.
const DefaultMaxImportSize = 64 << 30

// staleTemp is how old a temporary file must be before NewLocalStore takes
// it for the leftover of a crash rather than an upload in progress.
const staleTemp = 24 * time.Hour

// LocalStore is a directory of layer images named by digest:
// dir/sha256/<hex>.erofs, read-only once there. Images are written to
// dir/tmp first and renamed into place after an fsync, so a name always
// holds a complete image. Safe for concurrent use, also by several
// processes sharing dir.
type LocalStore struct {
	dir string
	// MaxImportSize bounds what Import accepts; zero means
	// DefaultMaxImportSize.
	MaxImportSize int64
}

// NewLocalStore opens (creating it if need be) the store in dir and
// removes temporary files a crash left behind.
func NewLocalStore(dir string) (*LocalStore, error) {
	s := &LocalStore{dir: dir}
	for _, d := range []string{s.blobDir(), s.tmpDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("open layer store: %w", err)
		}
	}
	entries, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return nil, fmt.Errorf("open layer store: %w", err)
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleTemp {
			os.RemoveAll(filepath.Join(s.tmpDir(), e.Name()))
		}
	}
	return s, nil
}

func (s *LocalStore) blobDir() string { return filepath.Join(s.dir, "sha256") }
func (s *LocalStore) tmpDir() string  { return filepath.Join(s.dir, "tmp") }

func (s *LocalStore) blobPath(hexDigest string) string {
	return filepath.Join(s.blobDir(), hexDigest+".erofs")
}

// Put copies the EROFS image at srcPath into the store. Putting an image
// the store already holds is a no-op.
func (s *LocalStore) Put(ctx context.Context, srcPath string) (Image, error) {
	f, err := os.Open(srcPath)
	if err != nil {
		return Image{}, fmt.Errorf("put layer %s: %w", srcPath, err)
	}
	defer f.Close()
	img, err := s.ingest(ctx, f, -1)
	if err != nil {
		return Image{}, fmt.Errorf("put layer %s: %w", srcPath, err)
	}
	return img, nil
}

// Import streams an uploaded EROFS image into the store, hashing it on the
// way. An image larger than MaxImportSize is errdefs.ErrTooLarge, one that
// is not EROFS errdefs.ErrInvalid.
func (s *LocalStore) Import(ctx context.Context, r io.Reader) (Image, error) {
	limit := s.MaxImportSize
	if limit <= 0 {
		limit = DefaultMaxImportSize
	}
	img, err := s.ingest(ctx, r, limit)
	if err != nil {
		return Image{}, fmt.Errorf("import layer: %w", err)
	}
	return img, nil
}

// ingest copies r (at most limit bytes, unless limit < 0) to a temporary
// file, checks it is EROFS, and commits it under its digest.
func (s *LocalStore) ingest(ctx context.Context, r io.Reader, limit int64) (Image, error) {
	// The superblock comes first: refuse a wrong upload before storing it.
	head := make([]byte, superOffset+4)
	n, err := io.ReadFull(r, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return Image{}, fmt.Errorf("read image: %w", err)
	}
	if n < len(head) || !IsEROFS(bytes.NewReader(head)) {
		return Image{}, errdefs.Invalid("not an EROFS image")
	}

	tmp, err := os.CreateTemp(s.tmpDir(), "ingest-*.erofs")
	if err != nil {
		return Image{}, err
	}
	committed := false
	defer func() {
		tmp.Close()
		if !committed {
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	w := io.MultiWriter(tmp, h)
	if _, err := w.Write(head); err != nil {
		return Image{}, fmt.Errorf("write image: %w", err)
	}
	src := r
	if limit >= 0 {
		// One byte over the limit tells a too-large image from one that
		// fits exactly.
		src = io.LimitReader(r, limit-int64(len(head))+1)
	}
	copied, err := copyContext(ctx, w, src, make([]byte, 1<<20))
	if err != nil {
		return Image{}, fmt.Errorf("write image: %w", err)
	}
	size := int64(len(head)) + copied
	if limit >= 0 && size > limit {
		return Image{}, fmt.Errorf("image larger than %d bytes: %w", limit, errdefs.ErrTooLarge)
	}
	if err := tmp.Sync(); err != nil {
		return Image{}, fmt.Errorf("sync image: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return Image{}, fmt.Errorf("close image: %w", err)
	}
	img := Image{Digest: digestPrefix + hex.EncodeToString(h.Sum(nil)), Size: size}
	if err := s.commit(tmp.Name(), img); err != nil {
		return Image{}, err
	}
	committed = true
	return img, nil
}

// commit renames the complete, synced image at tmpPath (in the store's
// file system) to its final name, unless the store has it already.
func (s *LocalStore) commit(tmpPath string, img Image) error {
	h, err := ParseDigest(img.Digest)
	if err != nil {
		return err
	}
	final := s.blobPath(h)
	if _, err := os.Stat(final); err == nil {
		return os.Remove(tmpPath)
	}
	if err := os.Chmod(tmpPath, 0o444); err != nil {
		return fmt.Errorf("commit %s: %w", img.Digest, err)
	}
	if err := os.Rename(tmpPath, final); err != nil {
		return fmt.Errorf("commit %s: %w", img.Digest, err)
	}
	return syncDir(s.blobDir())
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// Path returns the file of the image with the given digest:
// errdefs.ErrInvalid for a malformed digest, errdefs.ErrNotFound if the
// store lacks it.
func (s *LocalStore) Path(digest string) (string, error) {
	img, err := s.Stat(digest)
	if err != nil {
		return "", err
	}
	h, _ := ParseDigest(img.Digest)
	return s.blobPath(h), nil
}

// Stat describes the stored image with the given digest.
func (s *LocalStore) Stat(digest string) (Image, error) {
	h, err := ParseDigest(digest)
	if err != nil {
		return Image{}, fmt.Errorf("stat layer: %w", err)
	}
	st, err := os.Stat(s.blobPath(h))
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, errdefs.NotFound("layer %s", digest)
	}
	if err != nil {
		return Image{}, fmt.Errorf("stat layer %s: %w", digest, err)
	}
	return Image{Digest: digest, Size: st.Size()}, nil
}

// Delete removes the image with the given digest. Mounts of it keep
// working: a mount holds the file, not its name.
func (s *LocalStore) Delete(digest string) error {
	h, err := ParseDigest(digest)
	if err != nil {
		return fmt.Errorf("delete layer: %w", err)
	}
	err = os.Remove(s.blobPath(h))
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.NotFound("layer %s", digest)
	}
	if err != nil {
		return fmt.Errorf("delete layer %s: %w", digest, err)
	}
	return syncDir(s.blobDir())
}
