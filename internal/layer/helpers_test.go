package layer_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/mount"
	"github.com/dsec-project/dsec/internal/testutil"
)

// ent is one tar entry of a test archive; the zero Mode, Uid, Gid and
// ModTime are fine defaults.
type ent struct {
	name    string
	typ     byte
	mode    int64
	uid     int
	gid     int
	link    string
	body    string
	mtime   time.Time
	major   int64
	minor   int64
	xattrs  map[string]string
	rawSize int64 // overrides len(body) in the header when set
}

func file(name, body string) ent { return ent{name: name, typ: tar.TypeReg, mode: 0o644, body: body} }
func dir(name string) ent        { return ent{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, mode: 0o777, link: target}
}
func hardlink(name, target string) ent { return ent{name: name, typ: tar.TypeLink, link: target} }

// tarOf writes the entries as a PAX archive, which keeps nanosecond
// mtimes and xattrs.
func tarOf(t *testing.T, entries ...ent) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Typeflag: e.typ,
			Name:     e.name,
			Linkname: e.link,
			Mode:     e.mode,
			Uid:      e.uid,
			Gid:      e.gid,
			ModTime:  e.mtime,
			Devmajor: e.major,
			Devminor: e.minor,
			Format:   tar.FormatPAX,
		}
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if e.rawSize != 0 {
			hdr.Size = e.rawSize
		}
		if len(e.xattrs) > 0 {
			hdr.PAXRecords = map[string]string{}
			for k, v := range e.xattrs {
				hdr.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("write tar header %s: %v", e.name, err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatalf("write tar body %s: %v", e.name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("close tar: %v", err)
	}
	return &buf
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return st
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

func getxattr(p, name string) (string, bool) {
	buf := make([]byte, 4096)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return "", false
	}
	return string(buf[:n]), true
}

// snapshot describes every file under dir (type, mode, owner, size, link
// count, content, xattrs), to show nothing there changed.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		line := []string{p, fs.FileMode(st.Mode).String(), time.Unix(st.Mtim.Unix()).String()}
		line = append(line, strings.Repeat("l", int(st.Nlink)))
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line = append(line, string(b))
		}
		names := make([]byte, 4096)
		if n, err := unix.Llistxattr(p, names); err == nil {
			line = append(line, string(names[:n]))
		}
		lines = append(lines, strings.Join(line, " "))
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// requireMounts is what every test that mounts needs.
func requireMounts(t *testing.T) {
	t.Helper()
	testutil.Require(t, testutil.Root, testutil.Tool("mkfs.erofs"),
		testutil.Filesystem("erofs"), testutil.Filesystem("overlay"))
}

// mountEROFS mounts image on a fresh directory until the test ends.
func mountEROFS(t *testing.T, image string) string {
	t.Helper()
	mnt := t.TempDir()
	if err := mount.EROFS(image, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := mount.Unmount(mnt); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return mnt
}

// mountOverlay mounts a writable overlay of lowers until the test ends.
func mountOverlay(t *testing.T, lowers ...string) string {
	t.Helper()
	base := t.TempDir()
	upper, work, mnt := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "mnt")
	for _, d := range []string{upper, work, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := mount.Overlay(lowers, upper, work, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := mount.Unmount(mnt); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return mnt
}
