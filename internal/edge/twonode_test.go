package edge_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/container"
	"github.com/dsec-project/dsec/internal/blob/s3"
	"github.com/dsec-project/dsec/internal/blobfs"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/testutil"
)

// node is one edge with its own data directory, blobfs and container
// backend, over the shared layer store.
type node struct {
	edge   *edge.Edge
	layers *edge.StoreLayers
	fs     *blobfs.FS
}

func startNode(t *testing.T, id string, st *layer.Store) *node {
	t.Helper()
	root := t.TempDir()
	ld, err := edge.NewStoreLayers(edge.StoreLayersConfig{
		Store: st, Dir: filepath.Join(root, "layerdata"), Blobfs: filepath.Join(root, "blobfs"),
	})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := blobfs.Mount(blobfs.Config{
		Mountpoint: filepath.Join(root, "blobfs"), ManifestDir: ld.ManifestDir(),
		CacheDir: filepath.Join(root, "chunks"), CacheMax: 1 << 30, Source: st,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	b, err := container.New(container.Config{
		Root: filepath.Join(root, "container"), AgentPath: filepath.Join(testutil.Binaries(t), "dsec-agent"),
		CgroupParent: "dsec-test-" + filepath.Base(filepath.Dir(root)) + "-" + filepath.Base(root), // root is <TestName><random>/NNN
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		testutil.UnmountAll(filepath.Join(root, "container"))
	})
	e, err := edge.New(context.Background(), edge.Config{
		NodeID: id, Backends: []backend.Backend{b}, Layers: ld, Packer: ld,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &node{edge: e, layers: ld, fs: fs}
}

func (n *node) create(t *testing.T, id string, layers ...string) {
	t.Helper()
	ctx := context.Background()
	_, err := n.edge.Create(ctx, edge.CreateRequest{
		ID: id, Backend: api.BackendContainer, Layers: layers,
		Resources: api.Resources{CPU: 0.5, MemoryMB: 64, Pids: 128}, Network: api.Network{Mode: api.NetworkNone},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.edge.Destroy(context.Background(), id) })
}

func (n *node) sh(t *testing.T, id, cmd string) string {
	t.Helper()
	ag, err := n.edge.Agent(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := ag.Exec(ctx, &api.ExecRequest{Shell: cmd})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q: %+v, %v", cmd, res, err)
	}
	return res.Stdout
}

// TestTwoNodesShareAStore: two nodes over one S3 store (a real S3 server).
// Node A starts a sandbox from layers built into the store, its data read
// on demand; a snapshot taken on node A starts on node B, which fetched
// nothing before, and shows what node A's sandbox saw.
func TestTwoNodesShareAStore(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.Tool("mkfs.erofs"),
		testutil.File("/bin/busybox"), testutil.File("/dev/fuse"), testutil.Filesystem("erofs"))
	ctx := context.Background()
	srv := testutil.StartS3(t)
	cfg, err := s3.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	bs, err := s3.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := layer.NewStore(bs, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	if err := layer.MinimalBase(ctx, "/bin/busybox", src); err != nil {
		t.Fatal(err)
	}
	base, err := st.Build(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	wsDir := t.TempDir()
	os.MkdirAll(filepath.Join(wsDir, "ws"), 0o755)
	os.WriteFile(filepath.Join(wsDir, "ws", "readme"), []byte("from the store\n"), 0o644)
	ws, err := st.Build(ctx, wsDir)
	if err != nil {
		t.Fatal(err)
	}

	a, b := startNode(t, "node-a", st), startNode(t, "node-b", st)
	a.create(t, "sb-on-a", base.Digest, ws.Digest)
	if got := a.sh(t, "sb-on-a", "cat /ws/readme"); got != "from the store\n" {
		t.Fatalf("node A reads %q", got)
	}
	a.sh(t, "sb-on-a", "echo changed > /ws/readme; mkdir /ws/new; echo n > /ws/new/f; rm -rf /root")
	const view = "find /ws /root 2>&1 | sort; cat /ws/readme /ws/new/f"
	want := a.sh(t, "sb-on-a", view)
	snap, err := a.edge.Snapshot(ctx, "sb-on-a", edge.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if s := a.fs.Stats(); s.FetchedBytes == 0 {
		t.Errorf("node A fetched nothing through blobfs: %+v", s)
	}

	if s := b.fs.Stats(); s.FetchedBytes != 0 {
		t.Fatalf("node B fetched before its first sandbox: %+v", s)
	}
	b.create(t, "sb-on-b", base.Digest, ws.Digest, snap.Digest)
	if got := b.sh(t, "sb-on-b", view); got != want {
		t.Fatalf("node B sees\n%s\nwant\n%s", got, want)
	}
	if s := b.fs.Stats(); s.FetchedBytes == 0 || s.ReadErrors != 0 {
		t.Errorf("node B blobfs: %+v", s)
	}
}
