// Package initramfs builds the initial RAM filesystem a microVM boots
// from: a cpio archive in the kernel's "newc" format holding dsec-agent
// as /init and the kernel modules it loads (with their dependencies,
// resolved from each module's own .modinfo, since the kernel package
// ships no modules.dep). It needs no external tool. It must never put
// anything in an archive that the guest does not need: the archive lives
// in the guest's memory until the agent switches root.
package initramfs

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"strings"
)

// Writer writes a newc cpio archive. Directories that a file's path needs
// are made on first use. Call Close to write the trailer.
type Writer struct {
	w     *bufio.Writer
	off   int64
	ino   uint32
	dirs  map[string]bool
	mtime uint32 // every entry's mtime, for reproducible archives
	err   error
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriterSize(w, 1<<20), dirs: map[string]bool{".": true, "/": true, "": true}}
}

const (
	modeDir  = 0o040000
	modeFile = 0o100000
	modeLink = 0o120000
	modeChr  = 0o020000
)

// Dir adds a directory (and its parents).
func (w *Writer) Dir(name string, perm uint32) error {
	name = clean(name)
	if w.dirs[name] {
		return w.err
	}
	w.parents(name)
	w.dirs[name] = true
	return w.entry(name, modeDir|perm&0o7777, 0, 0, nil)
}

// File adds a regular file of size bytes read from r.
func (w *Writer) File(name string, perm uint32, size int64, r io.Reader) error {
	name = clean(name)
	w.parents(name)
	return w.entry(name, modeFile|perm&0o7777, size, 0, r)
}

// Symlink adds a symbolic link to target.
func (w *Writer) Symlink(name, target string) error {
	name = clean(name)
	w.parents(name)
	return w.entry(name, modeLink|0o777, int64(len(target)), 0, strings.NewReader(target))
}

// CharDev adds a character device node, e.g. /dev/console (5, 1), which
// the kernel opens for init's stdio before any devtmpfs is mounted.
func (w *Writer) CharDev(name string, perm uint32, major, minor uint32) error {
	name = clean(name)
	w.parents(name)
	return w.entry(name, modeChr|perm&0o7777, 0, major<<8|minor, nil)
}

func (w *Writer) parents(name string) {
	if d := path.Dir(name); !w.dirs[d] {
		w.Dir(d, 0o755)
	}
}

// entry writes one header, the name, and size bytes of data, each padded
// to four bytes as newc wants.
func (w *Writer) entry(name string, mode uint32, size int64, rdev uint32, r io.Reader) error {
	if w.err != nil {
		return w.err
	}
	if size > 0xffffffff {
		w.err = fmt.Errorf("cpio %s: %d bytes is over the format's 4 GiB", name, size)
		return w.err
	}
	w.ino++
	nlink := uint32(1)
	if mode&modeDir != 0 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		w.ino, mode, 0, 0, nlink, w.mtime, size, 0, 0, rdev>>8, rdev&0xff, len(name)+1, 0)
	w.write([]byte(hdr))
	w.write([]byte(name + "\x00"))
	w.pad()
	if r != nil && size > 0 {
		n, err := io.CopyN(w.w, r, size)
		w.off += n
		if err != nil && w.err == nil {
			w.err = fmt.Errorf("cpio %s: %w", name, err)
		}
	}
	w.pad()
	return w.err
}

func (w *Writer) write(b []byte) {
	if w.err != nil {
		return
	}
	n, err := w.w.Write(b)
	w.off += int64(n)
	w.err = err
}

func (w *Writer) pad() {
	if n := w.off % 4; n != 0 {
		w.write(make([]byte, 4-n))
	}
}

// Close writes the trailer and flushes. It does not close the underlying
// writer.
func (w *Writer) Close() error {
	w.ino = 0
	w.entry("TRAILER!!!", 0, 0, 0, nil)
	if w.err != nil {
		return w.err
	}
	return w.w.Flush()
}

// clean makes name relative, as the kernel's unpacker expects.
func clean(name string) string {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	if name == "" {
		return "."
	}
	return name
}
