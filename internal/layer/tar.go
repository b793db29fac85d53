package layer

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// Limits bound what one tar stream may create. A zero field takes its
// default.
type Limits struct {
	// MaxBytes bounds the summed size of the regular files.
	MaxBytes int64
	// MaxEntries bounds the number of tar entries.
	MaxEntries int
	// MaxPathLen bounds the length in bytes of an entry's name and of a
	// link's target.
	MaxPathLen int
}

// The defaults fit the largest environments we expect (a CUDA base image
// is tens of GB and a few hundred thousand files); callers facing
// untrusted uploads pass tighter limits.
const (
	DefaultMaxBytes   = 64 << 30
	DefaultMaxEntries = 4 << 20
	DefaultMaxPathLen = unix.PathMax - 1
)

// nameMax is the longest single path component Linux file systems take.
const nameMax = 255

func (l Limits) orDefault() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	if l.MaxPathLen <= 0 {
		l.MaxPathLen = DefaultMaxPathLen
	}
	return l
}

// Stats counts what ExtractTar created.
type Stats struct {
	// Files counts every non-directory created: regular files, hard
	// links, symlinks, devices, fifos and whiteouts.
	Files int
	// Dirs counts directories created, including parents a tar left
	// implicit.
	Dirs int
	// Bytes is the summed size of the regular files.
	Bytes int64
}

// paxXattrPrefix starts the PAX records that carry xattrs (GNU tar, bsdtar
// and Go's archive/tar all write them).
const paxXattrPrefix = "SCHILY.xattr."

// ExtractTar extracts the tar stream r (plain or gzip-compressed) into dir,
// which must exist and be empty, and returns what it created.
//
// It must run as root, and is faithful: regular files, directories, symlinks
// (verbatim, never followed), hard links, devices and fifos, with owner,
// mode (setuid, setgid and sticky included), mtime and the xattrs of PAX
// SCHILY.xattr records. A later entry replaces an earlier one of the same
// path. OCI whiteouts become overlayfs ones: dir/.wh.NAME a 0/0 character
// device NAME, dir/.wh..wh..opq the xattr trusted.overlay.opaque=y on dir.
// As the OCI spec says, a whiteout hides only lower layers: a NAME this tar
// already created stays (a directory is made opaque instead). Overlayfs's
// own xattrs are never taken from the tar: they could carry redirects.
//
// Nothing outside dir is ever touched: names that are absolute or climb
// out with ".." are rejected, and so is any entry whose path runs through a
// symlink (one an earlier entry planted, typically). Errors caused by the
// tar are errdefs.ErrInvalid, or errdefs.ErrTooLarge for a limit. On error
// dir holds a partial tree for the caller to remove.
func ExtractTar(ctx context.Context, r io.Reader, dir string, lim Limits) (Stats, error) {
	in, closeIn, err := decompress(r)
	if err != nil {
		return Stats{}, fmt.Errorf("extract tar: %w", err)
	}
	defer closeIn()
	x, err := newExtractor(dir, lim)
	if err != nil {
		return Stats{}, fmt.Errorf("extract tar: %w", err)
	}
	defer unix.Close(x.root)

	tr := tar.NewReader(in)
	for {
		if err := ctx.Err(); err != nil {
			return x.stats, fmt.Errorf("extract tar: %w", err)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		// ErrInsecurePath only reports what cleanName refuses anyway.
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return x.stats, fmt.Errorf("extract tar: read header: %w", readError(err))
		}
		if err := x.entry(ctx, hdr, tr); err != nil {
			return x.stats, fmt.Errorf("extract tar entry %q: %w", hdr.Name, err)
		}
	}
	if err := x.finishDirs(); err != nil {
		return x.stats, fmt.Errorf("extract tar: %w", err)
	}
	return x.stats, nil
}

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
	xzMagic   = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
)

// decompress sniffs the stream's first bytes. Only binary magics are
// recognised: a plain tar starts with a file name, which never begins so.
func decompress(r io.Reader) (io.Reader, func() error, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, err := br.Peek(len(xzMagic))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("read stream: %w", err)
	}
	switch {
	case bytes.HasPrefix(head, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("open gzip stream: %w", readError(err))
		}
		return zr, zr.Close, nil
	case bytes.HasPrefix(head, zstdMagic):
		return nil, nil, errdefs.Invalid("zstd-compressed tar is not supported: send it plain or gzip-compressed")
	case bytes.HasPrefix(head, xzMagic):
		return nil, nil, errdefs.Invalid("xz-compressed tar is not supported: send it plain or gzip-compressed")
	}
	return br, func() error { return nil }, nil
}

// readError classes a corrupt or truncated stream as invalid input; other
// read errors (the network, the context) pass through unchanged.
func readError(err error) error {
	var corrupt flate.CorruptInputError
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, tar.ErrFieldTooLong) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, gzip.ErrHeader) ||
		errors.Is(err, gzip.ErrChecksum) || errors.As(err, &corrupt) {
		return fmt.Errorf("%w: %w", errdefs.ErrInvalid, err)
	}
	return err
}

type extractor struct {
	root    int
	lim     Limits
	stats   Stats
	entries int
	buf     []byte
	// dirTimes is the mtime each directory gets once every entry is in:
	// creating anything in a directory moves its mtime, so directory times
	// are set last, as tar does. Directories the tar leaves implicit (the
	// root among them) get the epoch, so the tree, and the image built
	// from it, depends only on the tar.
	dirTimes map[string]unix.Timespec
}

func newExtractor(dir string, lim Limits) (*extractor, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open extraction directory: %w", err)
	}
	names, err := f.Readdirnames(1)
	f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read extraction directory: %w", err)
	}
	if len(names) > 0 {
		return nil, errdefs.Invalid("extraction directory %s is not empty", dir)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open extraction directory: %w", err)
	}
	return &extractor{
		root:     fd,
		lim:      lim.orDefault(),
		buf:      make([]byte, 256<<10),
		dirTimes: map[string]unix.Timespec{".": {}},
	}, nil
}

// cleanName turns a tar name into a clean path relative to the root, or
// refuses it.
func (x *extractor) cleanName(name string) (string, error) {
	if len(name) > x.lim.MaxPathLen {
		return "", errdefs.Invalid("path is %d bytes long, the limit is %d", len(name), x.lim.MaxPathLen)
	}
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return "", errdefs.Invalid("empty path or path with a NUL byte")
	}
	p := path.Clean(name)
	if path.IsAbs(p) {
		return "", errdefs.Invalid("absolute path")
	}
	if p == ".." || strings.HasPrefix(p, "../") {
		return "", errdefs.Invalid("path leaves the extraction directory")
	}
	for _, c := range strings.Split(p, "/") {
		if len(c) > nameMax {
			return "", errdefs.Invalid("path component is %d bytes long, the limit is %d", len(c), nameMax)
		}
	}
	return p, nil
}

func splitRel(p string) (dir, base string) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return ".", p
	}
	return p[:i], p[i+1:]
}

// implicitDir records a parent directory the tar did not list.
func (x *extractor) implicitDir(rel string) {
	x.stats.Dirs++
	if _, ok := x.dirTimes[rel]; !ok {
		x.dirTimes[rel] = unix.Timespec{}
	}
}

func (x *extractor) entry(ctx context.Context, hdr *tar.Header, r io.Reader) error {
	x.entries++
	if x.entries > x.lim.MaxEntries {
		return fmt.Errorf("more than %d entries: %w", x.lim.MaxEntries, errdefs.ErrTooLarge)
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	name, err := x.cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return errdefs.Invalid("the root can only be a directory")
		}
		if err := x.setAttrs(x.root, ".", hdr, false); err != nil {
			return err
		}
		x.dirTimes["."] = mtime(hdr)
		return nil
	}
	dir, base := splitRel(name)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return x.whiteout(dir, base, hdr)
	}
	parent, err := openBeneath(x.root, dir, true, x.implicitDir)
	if err != nil {
		return err
	}
	defer unix.Close(parent)

	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(parent, name, base, hdr)
	case tar.TypeReg, tar.TypeCont, tar.TypeGNUSparse:
		return x.file(ctx, parent, base, hdr, r)
	case tar.TypeSymlink:
		return x.symlink(parent, base, hdr)
	case tar.TypeLink:
		return x.hardlink(parent, name, base, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return x.node(parent, base, hdr)
	}
	return errdefs.Invalid("unsupported entry type %q", hdr.Typeflag)
}

func (x *extractor) dir(parent int, name, base string, hdr *tar.Header) error {
	st, err := lstatAt(parent, base)
	if err != nil {
		return err
	}
	if st.exists && !st.dir {
		if err := removeAt(parent, base); err != nil {
			return err
		}
	}
	if !st.dir {
		if err := unix.Mkdirat(parent, base, 0o700); err != nil {
			return fmt.Errorf("create directory: %w", err)
		}
		x.stats.Dirs++
	}
	// A whiteout and a directory of the same name in one layer mean "drop
	// the lower one, then add this": overlayfs says that with opaque.
	if st.whiteout {
		if err := lsetxattrAt(parent, base, overlayOpaque, []byte("y")); err != nil {
			return err
		}
	}
	if err := x.setAttrs(parent, base, hdr, false); err != nil {
		return err
	}
	x.dirTimes[name] = mtime(hdr)
	return nil
}

func (x *extractor) file(ctx context.Context, parent int, base string, hdr *tar.Header, r io.Reader) error {
	if hdr.Size > x.lim.MaxBytes-x.stats.Bytes {
		return fmt.Errorf("file contents exceed %d bytes: %w", x.lim.MaxBytes, errdefs.ErrTooLarge)
	}
	if err := removeAt(parent, base); err != nil {
		return err
	}
	fd, err := unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create file: %w", err)
	}
	f := os.NewFile(uintptr(fd), base)
	n, err := copyContext(ctx, f, r, x.buf)
	x.stats.Bytes += n
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close file: %w", cerr)
	}
	if err != nil {
		return fmt.Errorf("write file: %w", readError(err))
	}
	x.stats.Files++
	return x.finish(parent, base, hdr, false)
}

func (x *extractor) symlink(parent int, base string, hdr *tar.Header) error {
	if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return errdefs.Invalid("empty symlink target or one with a NUL byte")
	}
	if len(hdr.Linkname) > x.lim.MaxPathLen {
		return errdefs.Invalid("symlink target is %d bytes long, the limit is %d", len(hdr.Linkname), x.lim.MaxPathLen)
	}
	if err := removeAt(parent, base); err != nil {
		return err
	}
	if err := unix.Symlinkat(hdr.Linkname, parent, base); err != nil {
		return fmt.Errorf("create symlink: %w", err)
	}
	x.stats.Files++
	return x.finish(parent, base, hdr, true)
}

// hardlink links to an entry this tar already extracted. The target is
// resolved like any other path (beneath the root, through no symlink), and
// linkat does not follow a target that is itself a symlink. Owner, mode and
// times belong to the shared inode, set when its first name was extracted.
func (x *extractor) hardlink(parent int, name, base string, hdr *tar.Header) error {
	target, err := x.cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target: %w", err)
	}
	if target == name || target == "." {
		return errdefs.Invalid("hard link to itself or to the root")
	}
	tdir, tbase := splitRel(target)
	tparent, err := openBeneath(x.root, tdir, false, nil)
	if err != nil {
		return fmt.Errorf("hard link target: %w", err)
	}
	defer unix.Close(tparent)
	if err := removeAt(parent, base); err != nil {
		return err
	}
	err = unix.Linkat(tparent, tbase, parent, base, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return errdefs.Invalid("hard link target %s was not extracted before the link", target)
	case errors.Is(err, unix.EPERM):
		return errdefs.Invalid("hard link target %s is a directory", target)
	case err != nil:
		return fmt.Errorf("create hard link: %w", err)
	}
	x.stats.Files++
	return nil
}

func (x *extractor) node(parent int, base string, hdr *tar.Header) error {
	var mode uint32
	switch hdr.Typeflag {
	case tar.TypeChar:
		mode = unix.S_IFCHR
	case tar.TypeBlock:
		mode = unix.S_IFBLK
	default:
		mode = unix.S_IFIFO
	}
	// The kernel's dev_t has a 12-bit major and a 20-bit minor.
	if hdr.Devmajor < 0 || hdr.Devmajor >= 1<<12 || hdr.Devminor < 0 || hdr.Devminor >= 1<<20 {
		return errdefs.Invalid("device number %d:%d out of range", hdr.Devmajor, hdr.Devminor)
	}
	dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	if err := removeAt(parent, base); err != nil {
		return err
	}
	if err := unix.Mknodat(parent, base, mode|0o600, int(dev)); err != nil {
		return fmt.Errorf("create device node: %w", err)
	}
	x.stats.Files++
	return x.finish(parent, base, hdr, false)
}

// finish sets the metadata of a freshly created non-directory.
func (x *extractor) finish(parent int, base string, hdr *tar.Header, symlink bool) error {
	if err := x.setAttrs(parent, base, hdr, symlink); err != nil {
		return err
	}
	return setTimesAt(parent, base, mtime(hdr))
}

// setAttrs sets owner, then mode (chown clears setuid), then xattrs (chown
// clears security.capability). base was just created or checked by the
// caller and is not a symlink unless symlink is set, so Fchmodat, which
// would follow one, is safe.
func (x *extractor) setAttrs(parent int, base string, hdr *tar.Header, symlink bool) error {
	if hdr.Uid < 0 || hdr.Gid < 0 || int64(hdr.Uid) >= 1<<32-1 || int64(hdr.Gid) >= 1<<32-1 {
		return errdefs.Invalid("owner %d:%d out of range", hdr.Uid, hdr.Gid)
	}
	if err := unix.Fchownat(parent, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if !symlink {
		if err := unix.Fchmodat(parent, base, uint32(hdr.Mode)&0o7777, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	// Sorted, so the xattrs of a file (and so the image) come out the same
	// whatever order the map gives.
	var keys []string
	for k := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(k, paxXattrPrefix)
		if ok && !strings.HasPrefix(attr, overlayXattrPrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		attr := strings.TrimPrefix(k, paxXattrPrefix)
		err := lsetxattrAt(parent, base, attr, []byte(hdr.PAXRecords[k]))
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ERANGE) ||
			errors.Is(err, unix.E2BIG) || errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("%w: %w", errdefs.ErrInvalid, err)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// finishDirs sets directory times, now that nothing more is created in
// them. A directory a later entry replaced or removed is skipped.
func (x *extractor) finishDirs() error {
	paths := make([]string, 0, len(x.dirTimes))
	for p := range x.dirTimes {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if p == "." {
			if err := setTimesAt(x.root, ".", x.dirTimes[p]); err != nil {
				return err
			}
			continue
		}
		dir, base := splitRel(p)
		parent, err := openBeneath(x.root, dir, false, nil)
		if errors.Is(err, errdefs.ErrInvalid) {
			continue
		}
		if err != nil {
			return err
		}
		st, err := lstatAt(parent, base)
		if err == nil && st.dir {
			err = setTimesAt(parent, base, x.dirTimes[p])
		}
		unix.Close(parent)
		if err != nil {
			return err
		}
	}
	return nil
}

func mtime(hdr *tar.Header) unix.Timespec {
	return unix.Timespec{Sec: hdr.ModTime.Unix(), Nsec: int64(hdr.ModTime.Nanosecond())}
}

// copyContext copies src to dst through buf, checking ctx between chunks
// so a cancelled request stops even inside one huge file.
func copyContext(ctx context.Context, dst io.Writer, src io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		m, rerr := src.Read(buf)
		if m > 0 {
			w, werr := dst.Write(buf[:m])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
		}
		if errors.Is(rerr, io.EOF) {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}
