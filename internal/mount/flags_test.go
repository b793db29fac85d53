package mount

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/layer"
)

// euidEnv makes the test binary print its effective uid and exit: copied
// setuid into a layer, it shows whether setuid took effect.
const euidEnv = "DSEC_MOUNT_TEST_PRINT_EUID"

func TestMain(m *testing.M) {
	if os.Getenv(euidEnv) == "1" {
		fmt.Print(os.Geteuid())
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestLayerFlagsThroughOverlay checks what layerFlags promise: a layer
// mount is nosuid and noexec to whoever reaches it directly, yet a setuid
// binary in it runs, setuid, through a sandbox's overlay.
func TestLayerFlagsThroughOverlay(t *testing.T) {
	requireMounts(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	if err := copyFile(self, filepath.Join(src, "euid")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(filepath.Join(src, "euid"), 0o4755); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "suid.erofs")
	if _, err := layer.Build(context.Background(), src, img); err != nil {
		t.Fatal(err)
	}
	_, otherImg := buildImage(t, testTree{files: map[string]string{"other": "x"}})

	// The unprivileged user must be able to reach the overlay: t.TempDir
	// makes its directories 0700.
	tmp := t.TempDir()
	for _, p := range []string{filepath.Dir(tmp), tmp} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lm, om, ov := filepath.Join(tmp, "layer"), filepath.Join(tmp, "other"), filepath.Join(tmp, "ov")
	for _, d := range []string{lm, om, ov} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := EROFS(img, lm); err != nil {
		t.Fatal(err)
	}
	unmountAtCleanup(t, lm)
	if err := EROFS(otherImg, om); err != nil {
		t.Fatal(err)
	}
	unmountAtCleanup(t, om)
	if err := Overlay([]string{lm, om}, "", "", ov); err != nil {
		t.Fatal(err)
	}
	unmountAtCleanup(t, ov)

	run := func(path string) (string, error) {
		cmd := exec.Command(path)
		cmd.Env = []string{euidEnv + "=1"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.Output()
		return string(out), err
	}
	t.Run("setuid applies through the overlay", func(t *testing.T) {
		if out, err := run(filepath.Join(ov, "euid")); err != nil || out != "0" {
			t.Errorf("euid through the overlay = %q, %v; want 0", out, err)
		}
	})
	t.Run("no exec on the layer mount itself", func(t *testing.T) {
		if out, err := run(filepath.Join(lm, "euid")); !errors.Is(err, unix.EACCES) {
			t.Errorf("exec from the layer mount = %q, %v; want EACCES", out, err)
		}
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
