package image_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/internal/image"
	"github.com/dsec-project/dsec/internal/testutil"
)

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestGitWorkspace(t *testing.T) {
	testutil.Require(t, testutil.Tool("git"))
	repo := t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, "a.txt"), []byte("v1"), 0o644)
	git(t, repo, "add", ".")
	git(t, repo, "commit", "-qm", "one")
	first := git(t, repo, "rev-parse", "HEAD")
	os.WriteFile(filepath.Join(repo, "a.txt"), []byte("v2"), 0o644)
	git(t, repo, "commit", "-qam", "two")

	tests := []struct{ rev, want string }{{"", "v2"}, {first, "v1"}, {"main", "v2"}}
	for _, tc := range tests {
		t.Run("rev="+tc.rev, func(t *testing.T) {
			dir := t.TempDir()
			if err := image.GitWorkspace(context.Background(), repo, tc.rev, dir, "/work/repo"); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(dir, "work/repo/a.txt"))
			if err != nil || string(b) != tc.want {
				t.Fatalf("a.txt = %q, %v; want %q", b, err, tc.want)
			}
			if st := git(t, filepath.Join(dir, "work/repo"), "status", "--porcelain"); st != "" {
				t.Fatalf("clone is not clean: %q", st)
			}
		})
	}
	if err := image.GitWorkspace(context.Background(), repo, "", t.TempDir(), "/"); err == nil {
		t.Error("GitWorkspace with prefix / succeeded")
	}
	if err := image.Debootstrap(context.Background(), "bookworm", []string{"--evil"}, "", t.TempDir()); err == nil {
		t.Error("Debootstrap took an option as a package name")
	}
}

// A debootstrapped tree carries the build host's /etc/hostname and
// /etc/hosts; NeutralHostFiles replaces them, a link included, without
// writing outside the tree.
func TestNeutralHostFiles(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	etc := filepath.Join(dir, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "hostname"), []byte("build-host-42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(outside, "hosts")
	if err := os.WriteFile(victim, []byte("keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(etc, "hosts")); err != nil {
		t.Fatal(err)
	}
	if err := image.NeutralHostFiles(dir); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"hostname": "localhost\n", "hosts": "127.0.0.1\tlocalhost\n"} {
		b, err := os.ReadFile(filepath.Join(etc, name))
		if err != nil || !strings.HasPrefix(string(b), want) || strings.Contains(string(b), "build-host") {
			t.Errorf("/etc/%s = %q, %v; want it to start with %q", name, b, err, want)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep\n" {
		t.Errorf("the write followed the link out of the tree: %q", b)
	}
}
