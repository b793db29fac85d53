package image

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// DefaultMirror is the Debian mirror debootstrap uses by default.
const DefaultMirror = "http://deb.debian.org/debian"

// Debootstrap installs a Debian suite (e.g. bookworm) with the extra
// packages include into dir, an empty directory, with debootstrap's
// minbase variant, then drops the downloaded .debs and package lists,
// which a sandbox base does not need. Run as root.
func Debootstrap(ctx context.Context, suite string, include []string, mirror, dir string) error {
	if mirror == "" {
		mirror = DefaultMirror
	}
	if !isWord(suite) {
		return errdefs.Invalid("debian suite %q", suite)
	}
	for _, p := range include {
		if !isWord(p) {
			return errdefs.Invalid("debian package name %q", p)
		}
	}
	args := []string{"--variant=minbase"}
	if len(include) > 0 {
		args = append(args, "--include="+strings.Join(include, ","))
	}
	args = append(args, suite, dir, mirror)
	if err := runTool(ctx, "debootstrap", args...); err != nil {
		return err
	}
	for _, glob := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_Packages", "var/log/*.log"} {
		matches, _ := filepath.Glob(filepath.Join(dir, glob))
		for _, m := range matches {
			os.Remove(m)
		}
	}
	return NeutralHostFiles(dir)
}

// NeutralHostFiles gives the tree in dir an /etc/hostname and /etc/hosts
// of no machine: debootstrap copies the build host's, which every sandbox
// of the base would otherwise carry (a sandbox's own hostname is its id,
// set by its backend).
func NeutralHostFiles(dir string) error {
	etc := filepath.Join(dir, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return err
	}
	for name, content := range map[string]string{
		"hostname": "localhost\n",
		"hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n",
	} {
		p := filepath.Join(etc, name)
		os.Remove(p) // a link must not lead the write out of the tree
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("write /etc/%s: %w", name, err)
		}
	}
	return nil
}

// GitWorkspace clones the repository repo (a path or URL; rev a branch,
// tag or commit, or "" for its HEAD) with its history into dir/prefix,
// so that git works inside the sandbox.
func GitWorkspace(ctx context.Context, repo, rev, dir, prefix string) error {
	rel := filepath.Clean("/" + prefix)[1:]
	if rel == "" {
		return errdefs.Invalid("workspace prefix %q: want a directory such as /work/repo", prefix)
	}
	dst := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := runTool(ctx, "git", "clone", "--quiet", "--no-hardlinks", "--", repo, dst); err != nil {
		return err
	}
	if rev != "" {
		if err := runTool(ctx, "git", "-C", dst, "checkout", "--quiet", "--detach", rev); err != nil {
			return err
		}
	}
	return nil
}

func isWord(s string) bool {
	if s == "" || s[0] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune(".+-", r)) {
			return false
		}
	}
	return true
}

func runTool(ctx context.Context, name string, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := stderr.String()
		if len(msg) > 4096 {
			msg = msg[len(msg)-4096:]
		}
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(msg))
	}
	return nil
}
