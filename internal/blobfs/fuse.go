package blobfs

// A small FUSE protocol server of blobfs's own, for a read-only file
// system of one flat directory. It exists, rather than a general FUSE
// library, for one property: it keeps no state the kernel depends on. Node
// ids are derived from the blobs' digests and file handles are unused, so a
// new process given the /dev/fuse fd of a running mount (held by the
// keeper, see daemon.go) serves it on as if nothing happened: it asks the
// kernel to resend the requests the dead process had read and not answered
// (FUSE_NOTIFY_RESEND, Linux ≥ 6.9) and answers them. A reader sees a
// stall, never EIO.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/contentdigest"
)

// FUSE opcodes and constants (include/uapi/linux/fuse.h).
const (
	opLookup      = 1
	opForget      = 2
	opGetattr     = 3
	opOpen        = 14
	opRead        = 15
	opStatfs      = 17
	opRelease     = 18
	opInit        = 26
	opOpendir     = 27
	opReaddir     = 28
	opReleasedir  = 29
	opAccess      = 34
	opInterrupt   = 36
	opDestroy     = 38
	opBatchForget = 42

	notifyResend = 7

	initAsyncRead      = 1 << 0
	initBigWrites      = 1 << 5
	initParallelDirops = 1 << 18
	initMaxPages       = 1 << 22

	fopenDirectIO = 1 << 0

	inHeaderSize  = 40
	outHeaderSize = 16
	attrSize      = 88
	entryOutSize  = 40 + attrSize
	attrOutSize   = 16 + attrSize

	rootID = 1
	// pollID is the node of pollName, an empty file for pollHack.
	pollID   = 2
	pollName = ".poll"
	// maxWrite is small (nothing is written); the kernel wants read
	// buffers of at least maxWrite plus headers. Reads are bounded by
	// maxPages instead.
	maxWrite   = 32 << 10
	maxPages   = 256 // 1 MiB reads
	readBuf    = 128 << 10
	attrValid  = 3600 // seconds: blobs never change
	nReaders   = 4
	fuseKernel = 7
	fuseMinor  = 31
)

var le = binary.LittleEndian

// mountFUSE opens /dev/fuse and mounts a FUSE file system at mp served
// through the returned fd.
func mountFUSE(mp string) (int, error) {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/fuse: %w", err)
	}
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=%d,group_id=%d,allow_other,max_read=%d",
		fd, os.Getuid(), os.Getgid(), maxPages*4096)
	if err := unix.Mount("dsec-blobfs", mp, "fuse.blobfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount blobfs on %s: %w", mp, err)
	}
	return fd, nil
}

// conn serves one FUSE connection.
type conn struct {
	fd   int
	fs   *FS
	done chan struct{}
	err  error
}

// serveConn starts serving fd. With resume, the connection was served by
// a process that died: the kernel is asked to resend what it had read.
func serveConn(fd int, f *FS, resume bool) (*conn, error) {
	if err := unix.SetNonblock(fd, false); err != nil {
		return nil, fmt.Errorf("fuse fd: %w", err)
	}
	c := &conn{fd: fd, fs: f, done: make(chan struct{})}
	if resume {
		hdr := make([]byte, outHeaderSize)
		le.PutUint32(hdr[0:], outHeaderSize)
		le.PutUint32(hdr[4:], notifyResend)
		if _, err := unix.Write(fd, hdr); err != nil {
			// A kernel without resend: requests the dead process held
			// stay unanswered; say so loudly.
			f.log.Error("FUSE_NOTIFY_RESEND failed; requests of the previous blobfs may hang", "err", err)
		} else {
			f.log.Info("took over the FUSE connection; asked the kernel to resend")
		}
	}
	var once sync.Once
	var wg sync.WaitGroup
	for range nReaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The kernel copies a request into buf while the reader
			// thread is in read(2). Were a page of buf absent, pinning it
			// would fail once a SIGKILL is pending and the kernel would
			// end that request with EIO instead of leaving it to be
			// resent: keep buf resident.
			buf := make([]byte, readBuf)
			for i := range buf {
				buf[i] = 1
			}
			if err := unix.Mlock(buf); err != nil {
				f.log.Debug("mlock fuse buffer", "err", err)
			}
			for {
				n, err := unix.Read(fd, buf)
				switch {
				case err == nil:
					req := append([]byte(nil), buf[:n]...)
					go c.handle(req)
					continue
				case errors.Is(err, unix.EINTR), errors.Is(err, unix.ENOENT), errors.Is(err, unix.EAGAIN):
					continue
				case errors.Is(err, unix.ENODEV):
					// Unmounted.
				default:
					once.Do(func() { c.err = fmt.Errorf("read /dev/fuse: %w", err) })
				}
				return
			}
		}()
	}
	go func() { wg.Wait(); close(c.done) }()
	return c, nil
}

// reply answers request unique with errno or the payload.
func (c *conn) reply(unique uint64, errno syscall.Errno, payload ...[]byte) {
	n := outHeaderSize
	for _, p := range payload {
		n += len(p)
	}
	buf := make([]byte, outHeaderSize, n)
	for _, p := range payload {
		buf = append(buf, p...)
	}
	c.write(buf, unique, errno)
}

// write sends buf, whose first outHeaderSize bytes are left for the
// header.
func (c *conn) write(buf []byte, unique uint64, errno syscall.Errno) {
	le.PutUint32(buf[0:], uint32(len(buf)))
	le.PutUint32(buf[4:], uint32(-int32(errno)))
	le.PutUint64(buf[8:], unique)
	if _, err := unix.Write(c.fd, buf); err != nil && !errors.Is(err, unix.ENOENT) {
		// ENOENT: the request was interrupted and is gone.
		c.fs.log.Debug("fuse reply", "err", err)
	}
}

func (c *conn) handle(req []byte) {
	if len(req) < inHeaderSize {
		return
	}
	op := le.Uint32(req[4:])
	unique := le.Uint64(req[8:])
	node := le.Uint64(req[16:])
	body := req[inHeaderSize:]
	f := c.fs
	switch op {
	case opForget, opBatchForget, opInterrupt:
		// No answer; nothing to forget: node ids are derived, not kept.
	case opInit:
		c.init(unique, body)
	case opDestroy:
		c.reply(unique, 0)
	case opLookup:
		name, _, _ := strings.Cut(string(body), "\x00")
		if node != rootID {
			c.reply(unique, syscall.ENOTDIR)
			return
		}
		if name == pollName {
			out := make([]byte, entryOutSize)
			le.PutUint64(out[0:], pollID)
			putPollAttr(out[40:])
			c.reply(unique, 0, out)
			return
		}
		l, err := f.layer(name)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				f.log.Warn("lookup", "name", name, "err", err)
			}
			c.reply(unique, syscall.ENOENT)
			return
		}
		out := make([]byte, entryOutSize)
		le.PutUint64(out[0:], nodeID(l.hex))
		le.PutUint64(out[16:], attrValid)
		le.PutUint64(out[24:], attrValid)
		l.putAttr(out[40:])
		c.reply(unique, 0, out)
	case opGetattr:
		out := make([]byte, attrOutSize)
		le.PutUint64(out[0:], attrValid)
		if node == rootID {
			putRootAttr(out[16:])
		} else if node == pollID {
			putPollAttr(out[16:])
		} else if l, errno := f.node(node); errno != 0 {
			c.reply(unique, errno)
			return
		} else {
			l.putAttr(out[16:])
		}
		c.reply(unique, 0, out)
	case opOpen:
		if len(body) < 8 {
			c.reply(unique, syscall.EINVAL)
			return
		}
		flags := le.Uint32(body[0:])
		if node == rootID {
			c.reply(unique, syscall.EISDIR)
			return
		}
		if node == pollID {
			c.reply(unique, 0, make([]byte, 16))
			return
		}
		if _, errno := f.node(node); errno != 0 {
			c.reply(unique, errno)
			return
		}
		if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC|syscall.O_APPEND) != 0 {
			c.reply(unique, syscall.EROFS)
			return
		}
		// No page cache for blobfs files: EROFS caches what it reads.
		out := make([]byte, 16)
		le.PutUint32(out[8:], fopenDirectIO)
		c.reply(unique, 0, out)
	case opRead:
		if len(body) < 24 {
			c.reply(unique, syscall.EINVAL)
			return
		}
		off := int64(le.Uint64(body[8:]))
		size := int(le.Uint32(body[16:]))
		l, errno := f.node(node)
		if errno != 0 {
			c.reply(unique, errno)
			return
		}
		buf := make([]byte, outHeaderSize+size)
		n, err := f.read(f.ctx, l, buf[outHeaderSize:], off)
		if err != nil {
			f.m.readErrors.Inc()
			f.log.Warn("read failed", "layer", l.hex, "off", off, "len", size, "err", err)
			c.reply(unique, syscall.EIO)
			return
		}
		c.write(buf[:outHeaderSize+n], unique, 0)
	case opOpendir:
		c.reply(unique, 0, make([]byte, 16))
	case opReaddir:
		if len(body) < 24 {
			c.reply(unique, syscall.EINVAL)
			return
		}
		c.readdir(unique, int(le.Uint64(body[8:])), int(le.Uint32(body[16:])))
	case opRelease, opReleasedir, opAccess:
		c.reply(unique, 0)
	case opStatfs:
		out := make([]byte, 80)
		le.PutUint32(out[40:], 4096) // bsize
		le.PutUint32(out[44:], 255)  // namelen
		le.PutUint32(out[48:], 4096) // frsize
		c.reply(unique, 0, out)
	default:
		// xattrs, flush, statx, lseek...: the kernel stops asking.
		c.reply(unique, syscall.ENOSYS)
	}
}

func (c *conn) init(unique uint64, body []byte) {
	if len(body) < 16 {
		c.reply(unique, syscall.EINVAL)
		return
	}
	major, minor := le.Uint32(body[0:]), le.Uint32(body[4:])
	if major != fuseKernel || minor < 12 {
		c.fs.log.Error("unsupported FUSE protocol", "major", major, "minor", minor)
		c.reply(unique, syscall.EPROTO)
		return
	}
	readahead := min(le.Uint32(body[8:]), 128<<10)
	offered := le.Uint32(body[12:])
	out := make([]byte, 64)
	le.PutUint32(out[0:], fuseKernel)
	le.PutUint32(out[4:], min(minor, fuseMinor))
	le.PutUint32(out[8:], readahead)
	le.PutUint32(out[12:], offered&(initAsyncRead|initBigWrites|initParallelDirops|initMaxPages))
	binary.LittleEndian.PutUint16(out[16:], 64) // max_background
	binary.LittleEndian.PutUint16(out[18:], 48) // congestion_threshold
	le.PutUint32(out[20:], maxWrite)
	le.PutUint32(out[24:], 1) // time_gran
	binary.LittleEndian.PutUint16(out[28:], maxPages)
	c.reply(unique, 0, out)
}

// readdir lists the layers with a manifest in place, in name order; an
// entry's offset is its index plus one.
func (c *conn) readdir(unique uint64, off, size int) {
	ents, err := os.ReadDir(c.fs.cfg.ManifestDir)
	if err != nil {
		c.reply(unique, syscall.EIO)
		return
	}
	var names []string
	for _, e := range ents {
		if h, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			if _, err := contentdigest.Parse("sha256:" + h); err == nil {
				names = append(names, h)
			}
		}
	}
	sort.Strings(names)
	var out []byte
	for i := off; i < len(names); i++ {
		name := names[i]
		rec := (24 + len(name) + 7) &^ 7
		if len(out)+rec > size {
			break
		}
		d := make([]byte, rec)
		le.PutUint64(d[0:], nodeID(name))
		le.PutUint64(d[8:], uint64(i+1))
		le.PutUint32(d[16:], uint32(len(name)))
		le.PutUint32(d[20:], syscall.DT_REG)
		copy(d[24:], name)
		out = append(out, d...)
	}
	c.reply(unique, 0, out)
}

// nodeID derives a layer's node id from its digest: the same in every
// blobfs process, so that one taking over a mount knows the kernel's ids.
func nodeID(hex string) uint64 {
	if len(hex) < 16 {
		return 0
	}
	v, err := strconv.ParseUint(hex[:16], 16, 64)
	if err != nil {
		return 0
	}
	v &^= 1 << 63
	if v <= pollID {
		v += 3
	}
	return v
}

// node returns the layer with node id id.
func (f *FS) node(id uint64) (*blobLayer, syscall.Errno) {
	f.mu.Lock()
	hex, ok := f.nodes[id]
	f.mu.Unlock()
	if !ok {
		// Looked up by an earlier blobfs process: find the manifest.
		ents, err := os.ReadDir(f.cfg.ManifestDir)
		if err != nil {
			return nil, syscall.EIO
		}
		for _, e := range ents {
			if h, isJSON := strings.CutSuffix(e.Name(), ".json"); isJSON && nodeID(h) == id {
				hex, ok = h, true
				break
			}
		}
		if !ok {
			return nil, syscall.ESTALE
		}
	}
	l, err := f.layer(hex)
	if err != nil {
		f.log.Warn("node", "id", id, "layer", hex, "err", err)
		return nil, syscall.ESTALE
	}
	return l, 0
}

func putPollAttr(a []byte) {
	le.PutUint64(a[0:], pollID)
	le.PutUint32(a[60:], syscall.S_IFREG|0o444)
	le.PutUint32(a[64:], 1)
	le.PutUint32(a[80:], 4096)
}

// pollHack makes the kernel learn that blobfs has no FUSE_POLL before
// this process opens a blobfs file through Go's poller: epoll_ctl polls
// the file with the epoll instance locked, and a server in the same
// process needs that lock (to open cache files) to answer the POLL.
func pollHack(mp string) error {
	fd, err := unix.Open(mp+"/"+pollName, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("blobfs poll hack: %w", err)
	}
	defer unix.Close(fd)
	unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
	return nil
}

func putRootAttr(a []byte) {
	le.PutUint64(a[0:], rootID)
	le.PutUint32(a[60:], syscall.S_IFDIR|0o555)
	le.PutUint32(a[64:], 2)
	le.PutUint32(a[80:], 4096)
}

func (l *blobLayer) putAttr(a []byte) {
	size := uint64(l.blob.Size)
	le.PutUint64(a[0:], nodeID(l.hex))
	le.PutUint64(a[8:], size)
	le.PutUint64(a[16:], (size+511)/512)
	le.PutUint32(a[60:], syscall.S_IFREG|0o444)
	le.PutUint32(a[64:], 1)
	le.PutUint32(a[80:], 4096)
}

// wait blocks until the connection ends (the mount is gone) and reports
// why, nil for an unmount.
func (c *conn) wait(ctx context.Context) error {
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}
