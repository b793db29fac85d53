package blobfs_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/blobfs"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestStopDaemon: a stop request ends a blobfs only when nothing reads
// through it; one in use goes on serving.
func TestStopDaemon(t *testing.T) {
	fx := newFixture(t, 1<<30)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- blobfs.Serve(ctx, dir, blobfs.Config{
			ManifestDir: filepath.Join(filepath.Dir(fx.meta), "manifests"),
			CacheDir:    filepath.Join(t.TempDir(), "cache"), CacheMax: 1 << 30,
			Source: fx.store, Logger: slog.Default(),
		})
	}()
	t.Cleanup(func() { unix.Unmount(blobfs.MountDir(dir), unix.MNT_DETACH) })
	blob := filepath.Join(blobfs.MountDir(dir), strings.TrimPrefix(fx.digest, "sha256:"))
	testutil.Eventually(t, 10*time.Second, "blobfs up", func() error { _, err := os.Stat(blob); return err })
	// Serve mounts before it listens on its control socket: wait for both.
	testutil.Eventually(t, 10*time.Second, "blobfs control socket", func() error {
		c, err := net.Dial("unix", filepath.Join(dir, "blobfs.sock"))
		if err == nil {
			c.Close()
		}
		return err
	})

	f, err := os.Open(blob)
	if err != nil {
		t.Fatal(err)
	}
	stopped, err := blobfs.StopDaemon(ctx, dir)
	if err != nil || stopped {
		t.Fatalf("stop with a blob open = %v, %v; want false, nil", stopped, err)
	}
	got, err := io.ReadAll(f)
	f.Close()
	if err != nil || !bytes.Equal(got, fx.blob) {
		t.Fatalf("read after a refused stop: %d bytes, %v; want the blob's %d", len(got), err, len(fx.blob))
	}

	if stopped, err = blobfs.StopDaemon(ctx, dir); err != nil || !stopped {
		t.Fatalf("stop unused = %v, %v; want true, nil", stopped, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the stop")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(blobfs.MountDir(dir), &st); err == nil && st.Type == 0x65735546 {
		t.Fatal("the FUSE mount is still there")
	}
	if stopped, err = blobfs.StopDaemon(ctx, dir); err != nil || !stopped {
		t.Fatalf("stop with none running = %v, %v; want true, nil", stopped, err)
	}
}
