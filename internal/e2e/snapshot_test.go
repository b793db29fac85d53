package e2e

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/blobfs"
	"github.com/dsec-project/dsec/internal/testutil"
)

// view describes /ws inside a sandbox: every path with its owner, and
// file contents.
const view = `cd /ws && find . | sort | while read f; do
	o=$(stat -c %u:%g "$f")
	if [ -L "$f" ]; then echo "$f $o -> $(readlink "$f")"
	elif [ -f "$f" ] && [ $(stat -c %s "$f") -gt 200 ]; then echo "$f $o: $(md5sum < "$f")"
	elif [ -f "$f" ]; then echo "$f $o: $(cat "$f")"
	else echo "$f/ $o"; fi
done`

// TestSnapshot is pack_diff end to end, with layer data read on demand
// through blobfs: a sandbox's added, modified and deleted files and a
// directory replaced by another are saved as a snapshot layer; sandboxes
// started from it see exactly what the original saw; a chain deeper than
// the limit is flattened and still shows the same.
func TestSnapshot(t *testing.T) {
	s := startServer(t, "--snapshot-max-depth", "2", "--layer-direct-below", "0")
	c := s.Client
	ctx := ctxT(t)
	ws, err := c.CreateLayer(ctx, api.KindWorkspace, "snapws:1", makeTar(t,
		tarFile{name: "ws/", typ: tar.TypeDir},
		tarFile{name: "ws/keep", body: "keep"},
		tarFile{name: "ws/mod", body: "old"},
		tarFile{name: "ws/gone", body: "gone"},
		tarFile{name: "ws/dir/", typ: tar.TypeDir},
		tarFile{name: "ws/dir/a", body: "a"},
		tarFile{name: "ws/dir/b", body: "b"},
		tarFile{name: "ws/replace/", typ: tar.TypeDir},
		tarFile{name: "ws/replace/old1", body: "1"},
		tarFile{name: "ws/replace/old2", body: "2"},
		tarFile{name: "ws/link", typ: tar.TypeSymlink, link: "keep"},
	), false)
	if err != nil {
		t.Fatal(err)
	}
	base, err := c.GetLayer(ctx, "base:minimal")
	if err != nil {
		t.Fatal(err)
	}
	sb1 := newSandbox(t, c, &api.LayerRefs{Base: "base:minimal", Workspace: "snapws:1"})
	sh(t, c, sb1.ID, `cd /ws && echo new > mod && rm gone && rm dir/a && echo added > added &&
		rm -rf replace && mkdir replace && echo only > replace/only && rm link && ln -s mod link &&
		mkdir -p fresh/deep && echo x > fresh/deep/x && head -c 300000 /dev/urandom > big && md5sum big > big.md5 &&
		chown 1000:1000 added && chown -R 123:456 fresh`)
	want := sh(t, c, sb1.ID, view)
	if !strings.Contains(want, "./added 1000:1000: added") || !strings.Contains(want, "./keep 0:0: keep") {
		t.Fatalf("owners before the snapshot:\n%s", want)
	}

	snap1, err := c.Snapshot(ctx, sb1.ID, "snap:1")
	if err != nil {
		t.Fatal(err)
	}
	if snap1.Kind != api.KindSnapshot || !slices.Equal(snap1.Parents, []string{base.Digest, ws.Digest}) {
		t.Fatalf("snapshot layer %+v, want parents base, workspace", snap1)
	}
	if got := sh(t, c, sb1.ID, "cat /ws/mod"); got != "new\n" {
		t.Fatalf("snapshotted sandbox after thaw: %q", got)
	}

	sb2 := fromSnapshot(t, c, "snap:1")
	if got := sh(t, c, sb2.ID, view); got != want {
		t.Fatalf("sandbox from the snapshot sees\n%s\nwant\n%s", got, want)
	}
	if got := sh(t, c, sb2.ID, "cd /ws && md5sum -c big.md5"); !strings.Contains(got, "OK") {
		t.Fatalf("big file from the snapshot: %q", got)
	}
	// The layers' data came through the node's blobfs.
	if st, err := blobfs.DaemonStats(ctx, filepath.Join(s.DataDir, "edge", "blobfs")); err != nil || st.FetchedBytes == 0 || st.ReadErrors != 0 {
		t.Fatalf("blobfs stats %+v, %v", st, err)
	}

	// A chain: snap2 stacks on snap1; snap3 would be the third, over the
	// limit of 2, so it flattens snap1, snap2 and its own changes.
	sh(t, c, sb2.ID, "cd /ws && echo two > added && rm keep && rm -rf fresh")
	snap2, err := c.Snapshot(ctx, sb2.ID, "snap:2")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(snap2.Parents, []string{base.Digest, ws.Digest, snap1.Digest}) {
		t.Fatalf("second snapshot's parents %v", snap2.Parents)
	}
	sb3 := fromSnapshot(t, c, "snap:2")
	sh(t, c, sb3.ID, "cd /ws && echo three > three && rm -rf dir && echo file > dir")
	want3 := sh(t, c, sb3.ID, view)
	snap3, err := c.Snapshot(ctx, sb3.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(snap3.Parents, []string{base.Digest, ws.Digest}) {
		t.Fatalf("third snapshot not flattened: parents %v", snap3.Parents)
	}
	sb4 := fromSnapshot(t, c, snap3.Ref)
	if got := sh(t, c, sb4.ID, view); got != want3 {
		t.Fatalf("sandbox from the flattened snapshot sees\n%s\nwant\n%s", got, want3)
	}

	t.Run("bad requests", func(t *testing.T) {
		tests := []struct {
			name string
			req  api.CreateSandboxRequest
			code string
		}{
			{"layers and snapshot", api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal"}, Snapshot: "snap:1"}, api.CodeInvalid},
			{"not a snapshot", api.CreateSandboxRequest{Snapshot: "base:minimal"}, api.CodeInvalid},
			{"no such snapshot", api.CreateSandboxRequest{Snapshot: "nope:1"}, api.CodeNotFound},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				if _, err := c.CreateSandbox(ctx, &tc.req); client.Code(err) != tc.code {
					t.Fatalf("create = %v, want %s", err, tc.code)
				}
			})
		}
		if _, err := c.Snapshot(ctx, "sb-nonexistent", ""); client.Code(err) != api.CodeNotFound {
			t.Fatalf("snapshot of a missing sandbox = %v", err)
		}
	})
}

func fromSnapshot(t *testing.T, c *client.Client, ref string) *api.Sandbox {
	t.Helper()
	sb, err := c.CreateSandbox(ctxT(t), &api.CreateSandboxRequest{Snapshot: ref, Resources: api.Resources{MemoryMB: 128}})
	if err != nil {
		t.Fatalf("create from snapshot %s: %v", ref, err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	return sb
}

// A snapshot (and so a fork) of a sandbox whose agent died — the
// container's init, so the container stopped — is refused with a clear
// 409, not a 500; deleting it still works. (Found by dsec bench chaos.)
func TestSnapshotOfADeadSandbox(t *testing.T) {
	s := startServer(t)
	c := s.Client
	sb := newSandbox(t, c, nil)
	runcRoot := filepath.Join(s.DataDir, "edge", "container", "runc")
	out, err := exec.Command("runc", "--root", runcRoot, "state", sb.ID).Output()
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 1 {
		t.Fatalf("runc state %s: %v", out, err)
	}
	if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := testutil.Poll(10*time.Second, func() error {
		out, _ := exec.Command("runc", "--root", runcRoot, "state", sb.ID).Output()
		if !strings.Contains(string(out), `"stopped"`) {
			return fmt.Errorf("container still %s", out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Snapshot(ctxT(t), sb.ID, "dead:1")
	if client.Code(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("snapshot of a dead sandbox: %v, want failed_precondition saying it is not running", err)
	}
	_, err = c.Fork(ctxT(t), sb.ID, &api.ForkRequest{Count: 1})
	if client.Code(err) != api.CodeFailedPrecondition {
		t.Fatalf("fork of a dead sandbox: %v, want failed_precondition", err)
	}
	if err := c.DeleteSandbox(ctxT(t), sb.ID); err != nil {
		t.Fatal(err)
	}
}
