package agent_test

import (
	"bytes"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
)

func filesURL(p string, extra ...string) string {
	return "/files?" + strings.Join(append([]string{"path=" + url.QueryEscape(p)}, extra...), "&")
}

func TestFiles(t *testing.T) {
	a := startAgent(t, "--max-file-bytes", "4096")
	root := a.root
	put := func(t *testing.T, p, body string, extra ...string) (*http.Response, []byte) {
		return a.do("PUT", filesURL(p, extra...), strings.NewReader(body))
	}

	t.Run("write creates parents and reads back", func(t *testing.T) {
		resp, body := put(t, "/a/b/c.txt", "hello", "mode=0600")
		wantStatus(t, resp, body, http.StatusOK)
		if w := decode[api.FileWritten](t, body); w.Path != "/a/b/c.txt" || w.Size != 5 {
			t.Errorf("written %+v", w)
		}
		fi, err := os.Stat(filepath.Join(root, "a/b/c.txt"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("on disk: %v %v", fi, err)
		}
		resp, body = a.do("GET", filesURL("/a/b/c.txt"), nil)
		wantStatus(t, resp, body, http.StatusOK)
		if string(body) != "hello" || resp.Header.Get("Content-Type") != "application/octet-stream" || resp.ContentLength != 5 {
			t.Errorf("read %q %s %d", body, resp.Header.Get("Content-Type"), resp.ContentLength)
		}
	})
	t.Run("overwrite is atomic and leaves no temp file", func(t *testing.T) {
		for _, content := range []string{"one", "two, longer"} {
			resp, body := put(t, "/over.txt", content)
			wantStatus(t, resp, body, http.StatusOK)
		}
		if b, _ := os.ReadFile(filepath.Join(root, "over.txt")); string(b) != "two, longer" {
			t.Errorf("content %q", b)
		}
		if fi, _ := os.Stat(filepath.Join(root, "over.txt")); fi.Mode().Perm() != 0o644 {
			t.Errorf("default mode %v", fi.Mode())
		}
		assertNoTemp(t, root)
	})
	t.Run("list", func(t *testing.T) {
		if err := os.Symlink("c.txt", filepath.Join(root, "a/b/link")); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(root, "a/b/sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		resp, body := a.do("GET", filesURL("/a/b", "list=1"), nil)
		wantStatus(t, resp, body, http.StatusOK)
		l := decode[api.FileList](t, body)
		got := make([]string, len(l.Entries))
		for i, e := range l.Entries {
			got[i] = e.Name + ":" + e.Type + ":" + e.Target
		}
		if l.Path != "/a/b" || strings.Join(got, " ") != "c.txt:file: link:symlink:c.txt sub:dir:" {
			t.Errorf("list %s: %v", l.Path, got)
		}
		if e := l.Entries[0]; e.Size != 5 || e.Mode != 0o600 || e.ModTime.IsZero() {
			t.Errorf("entry %+v", e)
		}
		resp, body = a.do("GET", filesURL("/a/b/sub", "list=1"), nil)
		wantStatus(t, resp, body, http.StatusOK)
		if l := decode[api.FileList](t, body); l.Entries == nil || len(l.Entries) != 0 {
			t.Errorf("empty dir: %+v", l)
		}
	})
	t.Run("errors", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(root, "big"), bytes.Repeat([]byte("x"), 5000), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct {
			name, method, target, body, code string
		}{
			{"read missing", "GET", filesURL("/missing"), "", api.CodeNotFound},
			{"read under a missing dir", "GET", filesURL("/missing/x"), "", api.CodeNotFound},
			{"read under a file", "GET", filesURL("/over.txt/x"), "", api.CodeNotFound},
			{"list missing", "GET", filesURL("/missing", "list=1"), "", api.CodeNotFound},
			{"read a directory", "GET", filesURL("/a"), "", api.CodeInvalid},
			{"list a file", "GET", filesURL("/over.txt", "list=1"), "", api.CodeInvalid},
			{"read over the limit", "GET", filesURL("/big"), "", api.CodeTooLarge},
			{"write over the limit", "PUT", filesURL("/toobig"), strings.Repeat("x", 4097), api.CodeTooLarge},
			{"write under a file", "PUT", filesURL("/over.txt/x"), "x", api.CodeFailedPrecondition},
			{"write onto a directory", "PUT", filesURL("/a"), "x", api.CodeInvalid},
			{"write /", "PUT", filesURL("/"), "x", api.CodeInvalid},
			{"bad mode", "PUT", filesURL("/m", "mode=999"), "x", api.CodeInvalid},
			{"delete missing", "DELETE", filesURL("/missing"), "", api.CodeNotFound},
			{"delete a non-empty dir", "DELETE", filesURL("/a"), "", api.CodeFailedPrecondition},
			{"delete /", "DELETE", filesURL("/", "recursive=1"), "", api.CodeInvalid},
		} {
			t.Run(tt.name, func(t *testing.T) {
				resp, body := a.do(tt.method, tt.target, strings.NewReader(tt.body))
				wantError(t, resp, body, tt.code)
			})
		}
		if _, err := os.Stat(filepath.Join(root, "toobig")); !os.IsNotExist(err) {
			t.Errorf("a refused write left a file: %v", err)
		}
		assertNoTemp(t, root)
	})
	t.Run("write at the limit", func(t *testing.T) {
		resp, body := put(t, "/exact", strings.Repeat("x", 4096))
		wantStatus(t, resp, body, http.StatusOK)
	})
	t.Run("path validation", func(t *testing.T) {
		for _, tt := range []struct{ name, path string }{
			{"empty", ""},
			{"relative", "a/b"},
			{"dot dot", "/a/../b"},
			{"trailing dot dot", "/a/.."},
			{"only dot dot", "/.."},
			{"NUL", "/a\x00b"},
		} {
			for _, method := range []string{"GET", "PUT", "DELETE"} {
				t.Run(tt.name+" "+method, func(t *testing.T) {
					resp, body := a.do(method, filesURL(tt.path), strings.NewReader("x"))
					wantError(t, resp, body, api.CodeInvalid)
				})
			}
		}
	})
	t.Run("delete", func(t *testing.T) {
		resp, body := a.do("DELETE", filesURL("/over.txt"), nil)
		wantStatus(t, resp, body, http.StatusNoContent)
		if _, err := os.Lstat(filepath.Join(root, "over.txt")); !os.IsNotExist(err) {
			t.Errorf("still there: %v", err)
		}
		if err := os.Mkdir(filepath.Join(root, "empty"), 0o755); err != nil {
			t.Fatal(err)
		}
		resp, body = a.do("DELETE", filesURL("/empty"), nil)
		wantStatus(t, resp, body, http.StatusNoContent)
	})
	t.Run("recursive delete does not follow symlinks", func(t *testing.T) {
		outside := t.TempDir()
		keep := filepath.Join(outside, "keep")
		if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, "tree/deep/er"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, l := range []struct{ target, name string }{{outside, "tree/abs"}, {"../../..", "tree/deep/up"}} {
			if err := os.Symlink(l.target, filepath.Join(root, l.name)); err != nil {
				t.Fatal(err)
			}
		}
		resp, body := a.do("DELETE", filesURL("/tree", "recursive=1"), nil)
		wantStatus(t, resp, body, http.StatusNoContent)
		if _, err := os.Lstat(filepath.Join(root, "tree")); !os.IsNotExist(err) {
			t.Errorf("tree still there: %v", err)
		}
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("a file outside the tree was removed: %v", err)
		}
	})
	t.Run("symlinks resolve inside the root", func(t *testing.T) {
		for _, l := range []struct{ target, name string }{
			{"/etc/passwd", "abs"},
			{"../../../../../../etc/passwd", "rel"},
			{"/etc", "etcdir"},
			{"/", "top"},
		} {
			if err := os.Symlink(l.target, filepath.Join(root, l.name)); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{"/abs", "/rel", "/etcdir/passwd", "/top/etc/passwd"} {
			resp, body := a.do("GET", filesURL(p), nil)
			wantError(t, resp, body, api.CodeNotFound) // the root has no /etc/passwd yet
		}
		resp, body := put(t, "/top/etc/passwd", "inside")
		wantStatus(t, resp, body, http.StatusOK)
		if b, err := os.ReadFile(filepath.Join(root, "etc/passwd")); err != nil || string(b) != "inside" {
			t.Fatalf("write through a symlink landed outside the root: %q %v", b, err)
		}
		for _, p := range []string{"/abs", "/rel", "/etcdir/passwd", "/top/etc/passwd"} {
			resp, body := a.do("GET", filesURL(p), nil)
			wantStatus(t, resp, body, http.StatusOK)
			if string(body) != "inside" {
				t.Errorf("read %s: %q, want the root's own file", p, body)
			}
		}
	})
}

func assertNoTemp(t *testing.T, root string) {
	t.Helper()
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), ".dsec-") {
			t.Errorf("temporary file left: %s", p)
		}
		return nil
	})
}
