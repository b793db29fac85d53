package backendtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// testDiskSnapshot: the disk image a backend.DiskSnapshotter hands to
// pack (added, modified and deleted files) boots a new sandbox that sees
// what the first one saw; the first runs on.
func testDiskSnapshot(t *testing.T, f Fixture, spec func(string) backend.Spec) {
	ctx := context.Background()
	b := f.New(t, t.TempDir())
	ds, ok := b.(backend.DiskSnapshotter)
	if !ok {
		t.Fatalf("backend %s has whole disks but no DiskSnapshotter", b.Name())
	}
	sp := spec(unique("dsnap"))
	sp.Backend = b.Name()
	if err := b.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), sp.ID) })
	ag := agentOf(b, sp.ID)
	const view = "find /srv /etc/motd /etc/issue.net 2>&1 | sort; cat /etc/motd /srv/d/new"
	run(t, ag, "echo changed > /etc/motd; rm /etc/issue.net; mkdir -p /srv/d; echo new > /srv/d/new")
	want := run(t, ag, view)
	img := filepath.Join(t.TempDir(), "snap.qcow2")
	err := ds.SnapshotDisk(ctx, sp.ID, func(ctx context.Context, path string) error {
		return os.Rename(path, img)
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := b.State(ctx, sp.ID); err != nil || st != api.StateRunning {
		t.Fatalf("after snapshot: state %q, %v", st, err)
	}
	run(t, ag, "true")
	if err := b.Snapshot(ctx, sp.ID, 0, func(context.Context, []string) error { return nil }); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a directory snapshot of a whole disk: %v", err)
	}

	sp2 := spec(unique("fromdsnap"))
	sp2.Backend = b.Name()
	sp2.Layers = []backend.Layer{{Digest: "sha256:" + strings.Repeat("5", 64), Path: img}}
	if err := b.Create(ctx, sp2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), sp2.ID) })
	if got := run(t, agentOf(b, sp2.ID), view); got != want {
		t.Fatalf("sandbox on the snapshot sees\n%s\nwant\n%s", got, want)
	}
}
