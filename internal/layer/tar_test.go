package layer_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/testutil"
)

var (
	t0 = time.Unix(1_600_000_000, 0)
	t1 = time.Unix(1_700_000_000, 123_456_789)
)

// faithfulTar has every entry type, owners, special modes, xattrs, hard
// links, replacements, whiteouts and opaque directories.
func faithfulTar(t *testing.T) *bytes.Buffer {
	withMtime := func(e ent, m time.Time) ent { e.mtime = m; return e }
	passwd := file("etc/passwd", "root:x:0:0::/root:/bin/sh\n")
	passwd.mtime = t1
	passwd.xattrs = map[string]string{
		"user.origin":              "test",
		"trusted.dsec":             "t",
		"trusted.overlay.redirect": "/evil",
	}
	su := file("bin/su", "su")
	su.mode = 0o4755
	sg := file("bin/sg", "sg")
	sg.mode, sg.gid = 0o2750, 42
	tmp := dir("tmp/")
	tmp.mode = 0o1777
	home := ent{name: "home/u/", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1000, mtime: t1}
	notes := ent{name: "home/u/notes", typ: tar.TypeReg, mode: 0o600, uid: 1000, gid: 1000, body: "hello"}
	sh := withMtime(symlink("bin/sh", "/bin/busybox"), t1)
	rel := symlink("bin/rel", "../etc/passwd")
	rel.uid, rel.gid = 5, 6
	return tarOf(t,
		withMtime(dir("./"), t0),
		withMtime(dir("etc/"), t0),
		passwd,
		withMtime(dir("bin/"), t0),
		su, sg, tmp, home, notes, sh, rel,
		hardlink("etc/hard", "etc/passwd"),
		ent{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
		ent{name: "dev/sda", typ: tar.TypeBlock, mode: 0o660, gid: 6, major: 8, minor: 0},
		ent{name: "run/fifo", typ: tar.TypeFifo, mode: 0o640},
		file("r", "first"), file("r", "second"),
		file("rd", "x"), dir("rd/"),
		dir("dr/"), file("dr/child", "c"), file("dr", "now a file"),
		symlink("sl", "/etc"), file("sl", "regular"),
		file("lower/.wh.gone", ""),
		dir("opq/"), file("opq/keep", "k"), file("opq/.wh..wh..opq", ""),
		file("same", "s"), file(".wh.same", ""),
		dir("samedir/"), file("samedir/f", "f"), file(".wh.samedir", ""),
		file(".wh.later", ""), dir("later/"),
		file(".wh.implicit", ""), file("implicit/f", "i"),
		file(".wh..wh.plnk", ""),
	)
}

func TestExtractTarFaithful(t *testing.T) {
	testutil.Require(t, testutil.Root)
	root := t.TempDir()
	stats, err := layer.ExtractTar(context.Background(), faithfulTar(t), root, layer.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	wantBytes := int64(len("root:x:0:0::/root:/bin/sh\n") + len("susghellofirstsecondxcnow a fileregularksfi"))
	if want := (layer.Stats{Files: 24, Dirs: 14, Bytes: wantBytes}); stats != want {
		t.Errorf("stats = %+v, want %+v", stats, want)
	}
	p := func(rel string) string { return filepath.Join(root, rel) }
	content := func(t *testing.T, rel, want string) {
		t.Helper()
		if b, err := os.ReadFile(p(rel)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", rel, b, err, want)
		}
	}
	kind := func(t *testing.T, rel string, typ uint32, perm uint32, uid, gid uint32) unix.Stat_t {
		t.Helper()
		st := lstat(t, p(rel))
		if st.Mode&unix.S_IFMT != typ || st.Mode&0o7777 != perm || st.Uid != uid || st.Gid != gid {
			t.Errorf("%s: mode %o owner %d:%d, want %o %d:%d", rel, st.Mode, st.Uid, st.Gid, typ|perm, uid, gid)
		}
		return st
	}
	mtimeIs := func(t *testing.T, rel string, want time.Time) {
		t.Helper()
		if st := lstat(t, p(rel)); st.Mtim.Sec != want.Unix() || st.Mtim.Nsec != int64(want.Nanosecond()) {
			t.Errorf("%s: mtime %v, want %v", rel, time.Unix(st.Mtim.Unix()), want)
		}
	}
	opaque := func(t *testing.T, rel string) {
		t.Helper()
		if v, ok := getxattr(p(rel), "trusted.overlay.opaque"); v != "y" {
			t.Errorf("%s: trusted.overlay.opaque = %q, %v; want y", rel, v, ok)
		}
	}
	link := func(t *testing.T, rel, want string) {
		t.Helper()
		if got, err := os.Readlink(p(rel)); err != nil || got != want {
			t.Errorf("%s -> %q, %v; want %q", rel, got, err, want)
		}
	}

	checks := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"root takes ./ metadata", func(t *testing.T) {
			kind(t, ".", unix.S_IFDIR, 0o755, 0, 0)
			mtimeIs(t, ".", t0)
		}},
		{"dir mtime set after its children", func(t *testing.T) { mtimeIs(t, "etc", t0) }},
		{"implicit parent is root 0755 at the epoch", func(t *testing.T) {
			kind(t, "home", unix.S_IFDIR, 0o755, 0, 0)
			mtimeIs(t, "home", time.Unix(0, 0))
		}},
		{"regular file", func(t *testing.T) {
			kind(t, "etc/passwd", unix.S_IFREG, 0o644, 0, 0)
			content(t, "etc/passwd", "root:x:0:0::/root:/bin/sh\n")
			mtimeIs(t, "etc/passwd", t1)
		}},
		{"xattrs kept, overlay xattrs dropped", func(t *testing.T) {
			if v, _ := getxattr(p("etc/passwd"), "user.origin"); v != "test" {
				t.Errorf("user.origin = %q", v)
			}
			if v, _ := getxattr(p("etc/passwd"), "trusted.dsec"); v != "t" {
				t.Errorf("trusted.dsec = %q", v)
			}
			if v, ok := getxattr(p("etc/passwd"), "trusted.overlay.redirect"); ok {
				t.Errorf("trusted.overlay.redirect = %q, want none", v)
			}
		}},
		{"setuid", func(t *testing.T) { kind(t, "bin/su", unix.S_IFREG, 0o4755, 0, 0) }},
		{"setgid and group", func(t *testing.T) { kind(t, "bin/sg", unix.S_IFREG, 0o2750, 0, 42) }},
		{"sticky", func(t *testing.T) { kind(t, "tmp", unix.S_IFDIR, 0o1777, 0, 0) }},
		{"owned directory and file", func(t *testing.T) {
			kind(t, "home/u", unix.S_IFDIR, 0o700, 1000, 1000)
			mtimeIs(t, "home/u", t1)
			kind(t, "home/u/notes", unix.S_IFREG, 0o600, 1000, 1000)
		}},
		{"symlinks verbatim", func(t *testing.T) {
			link(t, "bin/sh", "/bin/busybox")
			mtimeIs(t, "bin/sh", t1)
			link(t, "bin/rel", "../etc/passwd")
			if st := lstat(t, p("bin/rel")); st.Uid != 5 || st.Gid != 6 {
				t.Errorf("bin/rel owner %d:%d, want 5:6", st.Uid, st.Gid)
			}
		}},
		{"hard link", func(t *testing.T) {
			a, b := lstat(t, p("etc/passwd")), lstat(t, p("etc/hard"))
			if a.Ino != b.Ino || a.Nlink != 2 {
				t.Errorf("etc/hard inode %d, etc/passwd inode %d nlink %d", b.Ino, a.Ino, a.Nlink)
			}
		}},
		{"devices and fifo", func(t *testing.T) {
			if st := kind(t, "dev/null", unix.S_IFCHR, 0o666, 0, 0); st.Rdev != unix.Mkdev(1, 3) {
				t.Errorf("dev/null rdev %x", st.Rdev)
			}
			if st := kind(t, "dev/sda", unix.S_IFBLK, 0o660, 0, 6); st.Rdev != unix.Mkdev(8, 0) {
				t.Errorf("dev/sda rdev %x", st.Rdev)
			}
			kind(t, "run/fifo", unix.S_IFIFO, 0o640, 0, 0)
		}},
		{"later file replaces file", func(t *testing.T) { content(t, "r", "second") }},
		{"dir replaces file", func(t *testing.T) { kind(t, "rd", unix.S_IFDIR, 0o755, 0, 0) }},
		{"file replaces dir", func(t *testing.T) { content(t, "dr", "now a file") }},
		{"file replaces symlink", func(t *testing.T) { kind(t, "sl", unix.S_IFREG, 0o644, 0, 0) }},
		{"whiteout becomes 0/0 char device", func(t *testing.T) {
			if st := kind(t, "lower/gone", unix.S_IFCHR, 0, 0, 0); st.Rdev != 0 {
				t.Errorf("lower/gone rdev %x", st.Rdev)
			}
		}},
		{"opaque marker", func(t *testing.T) {
			opaque(t, "opq")
			content(t, "opq/keep", "k")
		}},
		{"whiteout keeps same-layer file", func(t *testing.T) { content(t, "same", "s") }},
		{"whiteout makes same-layer dir opaque", func(t *testing.T) {
			opaque(t, "samedir")
			content(t, "samedir/f", "f")
		}},
		{"dir after whiteout is opaque", func(t *testing.T) { opaque(t, "later") }},
		{"implicit dir after whiteout is opaque", func(t *testing.T) {
			opaque(t, "implicit")
			content(t, "implicit/f", "i")
		}},
		{"no .wh. names left", func(t *testing.T) {
			filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
				if err == nil && strings.HasPrefix(d.Name(), ".wh.") {
					t.Errorf("found %s", path)
				}
				return err
			})
		}},
	}
	for _, c := range checks {
		t.Run(c.name, c.check)
	}
}

// TestExtractTarContained feeds hostile archives and checks nothing
// outside the extraction directory changes: each one must fail or land
// inside.
func TestExtractTarContained(t *testing.T) {
	testutil.Require(t, testutil.Root)
	// A name under the host's /etc that must never appear.
	probe := fmt.Sprintf("dsec-escape-probe-%d", os.Getpid())
	t.Cleanup(func() { os.Remove("/etc/" + probe) })

	tests := []struct {
		name    string
		entries func(outside string) []ent
		wantErr bool
		check   func(t *testing.T, root string)
	}{
		{"dotdot", func(string) []ent { return []ent{file("../outside/x", "pwned")} }, true, nil},
		{"dotdot inside path", func(string) []ent { return []ent{file("a/../../outside/x", "pwned")} }, true, nil},
		{"absolute", func(o string) []ent { return []ent{file(o+"/abs", "pwned")} }, true, nil},
		{"absolute /etc", func(string) []ent { return []ent{file("/etc/"+probe, "pwned")} }, true, nil},
		{"symlink to / then a file through it", func(string) []ent {
			return []ent{symlink("a", "/"), file("a/etc/"+probe, "pwned")}
		}, true, nil},
		{"symlink outside then a file through it", func(o string) []ent {
			return []ent{symlink("b", o), file("b/x", "pwned")}
		}, true, nil},
		{"relative symlink escape", func(string) []ent {
			return []ent{symlink("c", "../outside"), file("c/x", "pwned")}
		}, true, nil},
		{"symlink to dotdot", func(string) []ent {
			return []ent{symlink("d", ".."), file("d/outside/x", "pwned")}
		}, true, nil},
		{"symlink chain up", func(string) []ent {
			return []ent{symlink("d", ".."), symlink("e", "d/../../../../.."), file("e/etc/"+probe, "pwned")}
		}, true, nil},
		{"magic link", func(string) []ent {
			return []ent{symlink("m", "/proc/self/root"), file("m/etc/"+probe, "pwned")}
		}, true, nil},
		{"hard link outside", func(string) []ent { return []ent{hardlink("h", "../outside/victim")} }, true, nil},
		{"hard link absolute", func(o string) []ent { return []ent{hardlink("h", o+"/victim")} }, true, nil},
		{"hard link through symlink", func(o string) []ent {
			return []ent{symlink("s", o), hardlink("h", "s/victim")}
		}, true, nil},
		{"hard link to host file", func(string) []ent { return []ent{hardlink("h", "/etc/passwd")} }, true, nil},
		{"hard link not yet extracted", func(string) []ent { return []ent{hardlink("h", "later"), file("later", "x")} }, true, nil},
		{"whiteout through symlink", func(o string) []ent {
			return []ent{symlink("s", o), file("s/.wh.victim", "")}
		}, true, nil},
		{"opaque through symlink", func(o string) []ent {
			return []ent{symlink("s", o), file("s/.wh..wh..opq", "")}
		}, true, nil},
		{"whiteout of dotdot", func(string) []ent { return []ent{file(".wh...", "")} }, true, nil},
		{"file replaces symlink to outside", func(o string) []ent {
			return []ent{symlink("v", o+"/victim"), file("v", "pwned")}
		}, false, func(t *testing.T, root string) {
			if st := lstat(t, filepath.Join(root, "v")); st.Mode&unix.S_IFMT != unix.S_IFREG {
				t.Errorf("v mode %o, want a regular file", st.Mode)
			}
		}},
		{"dir replaces symlink to outside", func(o string) []ent {
			return []ent{symlink("w", o), dir("w/"), file("w/x", "inside")}
		}, false, func(t *testing.T, root string) {
			if b, err := os.ReadFile(filepath.Join(root, "w/x")); err != nil || string(b) != "inside" {
				t.Errorf("w/x = %q, %v", b, err)
			}
		}},
		{"device replaces symlink to outside", func(o string) []ent {
			return []ent{symlink("n", o+"/victim"), {name: "n", typ: tar.TypeFifo, mode: 0o600}}
		}, false, nil},
		{"rewriting a hard link leaves its twin", func(string) []ent {
			return []ent{file("f", "orig"), hardlink("g", "f"), file("g", "new")}
		}, false, func(t *testing.T, root string) {
			if b, _ := os.ReadFile(filepath.Join(root, "f")); string(b) != "orig" {
				t.Errorf("f = %q, want orig", b)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
			for _, d := range []string{root, outside} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("original"), 0o644); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, outside)
			passwdBefore := lstat(t, "/etc/passwd")

			_, err := layer.ExtractTar(context.Background(), tarOf(t, tt.entries(outside)...), root, layer.Limits{})
			t.Logf("err: %v", err)
			if tt.wantErr && !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("err = %v, want ErrInvalid", err)
			}
			if !tt.wantErr && err != nil {
				t.Errorf("err = %v", err)
			}
			if after := snapshot(t, outside); after != before {
				t.Errorf("outside changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			if exists("/etc/" + probe) {
				t.Errorf("/etc/%s was created", probe)
			}
			if st := lstat(t, "/etc/passwd"); st.Nlink != passwdBefore.Nlink || st.Ctim != passwdBefore.Ctim {
				t.Errorf("/etc/passwd changed: nlink %d ctime %v", st.Nlink, st.Ctim)
			}
			if tt.check != nil {
				tt.check(t, root)
			}
		})
	}
}

func TestExtractTarLimits(t *testing.T) {
	testutil.Require(t, testutil.Root)
	long := strings.Repeat("d/", 40) + "f"
	tests := []struct {
		name    string
		lim     layer.Limits
		entries []ent
		want    error
	}{
		{"bytes", layer.Limits{MaxBytes: 10}, []ent{file("a", "123456"), file("b", "123456")}, errdefs.ErrTooLarge},
		{"bytes exactly", layer.Limits{MaxBytes: 12}, []ent{file("a", "123456"), file("b", "123456")}, nil},
		{"entries", layer.Limits{MaxEntries: 2}, []ent{dir("a/"), file("a/b", ""), file("a/c", "")}, errdefs.ErrTooLarge},
		{"path length", layer.Limits{MaxPathLen: 50}, []ent{file(long, "")}, errdefs.ErrInvalid},
		{"symlink target length", layer.Limits{MaxPathLen: 50}, []ent{symlink("s", long)}, errdefs.ErrInvalid},
		{"component length", layer.Limits{}, []ent{file(strings.Repeat("n", 256), "")}, errdefs.ErrInvalid},
		{"device number", layer.Limits{}, []ent{{name: "d", typ: tar.TypeChar, major: 1 << 12}}, errdefs.ErrInvalid},
		{"unsupported type", layer.Limits{}, []ent{{name: "v", typ: 'V'}}, errdefs.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := layer.ExtractTar(context.Background(), tarOf(t, tt.entries...), t.TempDir(), tt.lim)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestExtractTarInput(t *testing.T) {
	testutil.Require(t, testutil.Root)
	plain := tarOf(t, file("hello", "world")).Bytes()
	big := tarOf(t, file("big", strings.Repeat("x", 8192))).Bytes()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(plain)
	zw.Close()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	tests := []struct {
		name   string
		ctx    context.Context
		input  []byte
		prefil bool // the directory is not empty
		want   error
	}{
		{"plain", context.Background(), plain, false, nil},
		{"gzip", context.Background(), gz.Bytes(), false, nil},
		{"empty stream", context.Background(), nil, false, nil},
		{"zstd", context.Background(), []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0}, false, errdefs.ErrInvalid},
		{"truncated", context.Background(), big[:4096], false, errdefs.ErrInvalid},
		{"corrupt gzip", context.Background(), append(bytes.Clone(gz.Bytes()[:20]), make([]byte, 40)...), false, errdefs.ErrInvalid},
		{"garbage", context.Background(), bytes.Repeat([]byte("garbage!"), 128), false, errdefs.ErrInvalid},
		{"directory not empty", context.Background(), plain, true, errdefs.ErrInvalid},
		{"cancelled", cancelled, plain, false, context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if tt.prefil {
				os.WriteFile(filepath.Join(root, "x"), nil, 0o644)
			}
			_, err := layer.ExtractTar(tt.ctx, bytes.NewReader(tt.input), root, layer.Limits{})
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if tt.want == nil && len(tt.input) > 0 {
				// The plain and gzip inputs both hold hello.
				if b, err := os.ReadFile(filepath.Join(root, "hello")); err != nil || string(b) != "world" {
					t.Errorf("hello = %q, %v", b, err)
				}
			}
		})
	}
}
