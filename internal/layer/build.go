package layer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Image names a built or stored layer image.
type Image struct {
	// Digest is "sha256:<hex>" of the image file's bytes.
	Digest string
	// Size is the image file's length in bytes.
	Size int64
}

// mkfsTool is the image builder; tests and the store format depend on its
// flags below.
const mkfsTool = "mkfs.erofs"

// imageUUID is fixed so that the same tree always gives the same bytes.
const imageUUID = "00000000-0000-0000-0000-000000000000"

// mkfsArgs is the one place the on-disk format of a layer is chosen, so
// the store format can evolve here (metadata/data split with --chunksize
// and --blobdev, for one).
//
// Files keep their own mtimes: Python checks its .pyc caches against the
// source's mtime and make compares mtimes, so flattening them (what -T and
// SOURCE_DATE_EPOCH do in erofs-utils 1.5, for every inode) would make
// every cached bytecode file stale in every sandbox. Extended inodes store
// each file's mtime; the compact ones would borrow the superblock's build
// time. That build time is the one thing left that differs between two
// builds of one tree, and normalizeSuperblock zeroes it (erofs-utils 1.8
// can do the same with -T0 --mkfs-time).
//
// With blobPath set, regular files' data goes to that separate blob device
// in erofsChunkSize chunks, and outPath holds the metadata alone.
func mkfsArgs(srcDir, outPath, blobPath string) []string {
	args := []string{
		"--quiet",
		"-U" + imageUUID,
		"-Eforce-inode-extended",
		"--preserve-mtime",
	}
	if blobPath != "" {
		args = append(args, fmt.Sprintf("--chunksize=%d", erofsChunkSize), "--blobdev="+blobPath)
	}
	return append(args, outPath, srcDir)
}

// mkfsEnv is the builder's environment: ours without SOURCE_DATE_EPOCH,
// which would flatten every mtime (see mkfsArgs).
func mkfsEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SOURCE_DATE_EPOCH=") {
			env = append(env, kv)
		}
	}
	return env
}

// Build makes an EROFS image of srcDir at outPath and returns its digest.
// The same tree (contents, owners, modes, mtimes, xattrs) always gives the
// same bytes. Overlay whiteouts (0/0 character devices) and
// trusted.overlay.* xattrs are kept, so it must run as root: only root can
// read trusted xattrs. outPath appears complete or not at all.
func Build(ctx context.Context, srcDir, outPath string) (Image, error) {
	tmp, err := os.CreateTemp(filepath.Dir(outPath), ".build-*.erofs")
	if err != nil {
		return Image{}, fmt.Errorf("build image of %s: %w", srcDir, err)
	}
	tmpPath := tmp.Name()
	tmp.Close()
	img, err := build(ctx, srcDir, tmpPath)
	if err == nil {
		err = os.Rename(tmpPath, outPath)
	}
	if err != nil {
		os.Remove(tmpPath)
		return Image{}, fmt.Errorf("build image of %s: %w", srcDir, err)
	}
	return img, nil
}

func build(ctx context.Context, srcDir, outPath string) (Image, error) {
	if err := runMkfs(ctx, srcDir, outPath, ""); err != nil {
		return Image{}, err
	}
	return digestFile(outPath)
}

// buildChunked makes the metadata image metaPath and the blob blobPath of
// srcDir.
func buildChunked(ctx context.Context, srcDir, metaPath, blobPath string) error {
	return runMkfs(ctx, srcDir, metaPath, blobPath)
}

func runMkfs(ctx context.Context, srcDir, outPath, blobPath string) error {
	st, err := os.Stat(srcDir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return errdefs.Invalid("%s is not a directory", srcDir)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, mkfsTool, mkfsArgs(srcDir, outPath, blobPath)...)
	cmd.Env = mkfsEnv()
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 16 << 10}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s: %w: %s", mkfsTool, err, strings.TrimSpace(stderr.String()))
	}
	return normalizeSuperblock(outPath)
}

// limitedBuffer keeps the first max bytes written to it; a tool that
// floods stderr must not flood memory.
type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// The EROFS superblock, as far as we touch it
// (include/uapi/linux/erofs_fs.h, fs/erofs/super.c).
const (
	superOffset     = 1024
	superMagic      = 0xE0F5E1E2
	offChecksum     = 4
	offFeatCompat   = 8
	offBlkszBits    = 12
	offBuildTime    = 24 // u64 seconds
	offBuildNsec    = 32 // u32
	featSbChecksum  = 0x1
	minSuperblkSize = 128
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// normalizeSuperblock zeroes the build time in the superblock of the image
// at path and fixes up its checksum, so two builds of one tree are
// byte-identical. With every inode extended (see mkfsArgs) the build time
// is read by nothing else.
func normalizeSuperblock(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("normalize superblock: %w", err)
	}
	defer f.Close()
	head := make([]byte, superOffset+minSuperblkSize)
	if _, err := f.ReadAt(head, 0); err != nil {
		return fmt.Errorf("normalize superblock: read: %w", err)
	}
	sb := head[superOffset:]
	if binary.LittleEndian.Uint32(sb) != superMagic {
		return fmt.Errorf("normalize superblock: %s wrote no EROFS image", mkfsTool)
	}
	blkszBits := sb[offBlkszBits]
	if blkszBits < 9 || blkszBits > 16 {
		return fmt.Errorf("normalize superblock: block size 2^%d out of range", blkszBits)
	}
	// The checksum covers the superblock's block from the superblock on.
	n := 1 << blkszBits
	if n > superOffset {
		n -= superOffset
	}
	block := make([]byte, n)
	if _, err := f.ReadAt(block, superOffset); err != nil {
		return fmt.Errorf("normalize superblock: read: %w", err)
	}
	binary.LittleEndian.PutUint64(block[offBuildTime:], 0)
	binary.LittleEndian.PutUint32(block[offBuildNsec:], 0)
	if binary.LittleEndian.Uint32(block[offFeatCompat:])&featSbChecksum != 0 {
		binary.LittleEndian.PutUint32(block[offChecksum:], superblockChecksum(block))
	}
	if _, err := f.WriteAt(block[:minSuperblkSize], superOffset); err != nil {
		return fmt.Errorf("normalize superblock: write: %w", err)
	}
	return f.Close()
}

// superblockChecksum is the kernel's crc32c(~0, block with the checksum
// field zeroed), which, unlike the usual CRC-32C, is not inverted at the end.
func superblockChecksum(block []byte) uint32 {
	b := bytes.Clone(block)
	binary.LittleEndian.PutUint32(b[offChecksum:], 0)
	return ^crc32.Checksum(b, castagnoli)
}

// IsEROFS reports whether r starts with an EROFS superblock.
func IsEROFS(r io.ReaderAt) bool {
	var magic [4]byte
	if _, err := r.ReadAt(magic[:], superOffset); err != nil {
		return false
	}
	return binary.LittleEndian.Uint32(magic[:]) == superMagic
}

func digestFile(path string) (Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return Image{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Image{}, fmt.Errorf("hash %s: %w", path, err)
	}
	return Image{Digest: contentdigest.Prefix + hex.EncodeToString(h.Sum(nil)), Size: n}, nil
}
