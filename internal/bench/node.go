package bench

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/container"
	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/blobfs"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/mount"
)

// How a bench node gets its layers.
const (
	modeOnDemand = "on-demand (blobfs)"
	modeFull     = "full copy, then mount"
	modeUntar    = "untar per sandbox"
)

// benchNode is one simulated node: its own data directory (cold caches),
// container backend and edge, over the shared store.
type benchNode struct {
	root   string
	edge   *edge.Edge
	layers *edge.StoreLayers
	untar  *untarLayers
	fs     *blobfs.FS
	back   *container.Backend
	ids    []string
}

func newBenchNode(ctx context.Context, cfg ImageConfig, st *layer.Store, mode, name string) (*benchNode, error) {
	root, err := os.MkdirTemp(cfg.WorkDir, "node-"+name+"-")
	if err != nil {
		return nil, err
	}
	n := &benchNode{root: root}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var lay edge.Layers
	switch mode {
	case modeUntar:
		n.untar = &untarLayers{store: st.Blobs(), dir: filepath.Join(root, "untar"), keys: cfg.tarKeys}
		lay = n.untar
	default:
		lcfg := edge.StoreLayersConfig{Store: st, Dir: filepath.Join(root, "layerdata"), Mode: edge.ModeFull, Logger: quiet}
		if mode == modeOnDemand {
			lcfg.Mode, lcfg.Blobfs = edge.ModeOnDemand, filepath.Join(root, "blobfs")
		}
		if n.layers, err = edge.NewStoreLayers(lcfg); err != nil {
			return nil, err
		}
		lay = n.layers
		if mode == modeOnDemand {
			n.fs, err = blobfs.Mount(blobfs.Config{
				Mountpoint: lcfg.Blobfs, ManifestDir: n.layers.ManifestDir(),
				CacheDir: filepath.Join(root, "chunks"), CacheMax: 50 << 30, Source: st, Logger: quiet,
			})
			if err != nil {
				return nil, err
			}
		}
	}
	n.back, err = container.New(container.Config{
		Root: filepath.Join(root, "container"), AgentPath: cfg.AgentPath,
		CgroupParent: "dsec-bench-" + filepath.Base(root), Logger: quiet,
	})
	if err != nil {
		n.close()
		return nil, err
	}
	ecfg := edge.Config{NodeID: name, Backends: []backend.Backend{n.back}, Layers: lay, Logger: quiet}
	if n.layers != nil {
		ecfg.Packer = n.layers
	}
	if n.edge, err = edge.New(ctx, ecfg); err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

// start creates a sandbox from layers and runs cmd in it.
func (n *benchNode) start(ctx context.Context, id string, layers []string, cmd string) error {
	_, err := n.edge.Create(ctx, edge.CreateRequest{
		ID: id, Backend: api.BackendContainer, Layers: layers,
		Resources: api.Resources{CPU: 1, MemoryMB: 256, Pids: 256}, Network: api.Network{Mode: api.NetworkNone},
	})
	if err != nil {
		return err
	}
	n.ids = append(n.ids, id)
	_, err = n.sh(ctx, id, cmd)
	return err
}

func (n *benchNode) sh(ctx context.Context, id, cmd string) (string, error) {
	ag, err := n.edge.Agent(id)
	if err != nil {
		return "", err
	}
	res, err := ag.Exec(ctx, &api.ExecRequest{Shell: cmd, MaxOutputBytes: 1 << 20})
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return res.Stdout, fmt.Errorf("%q exited %d: %s", cmd, res.ExitCode, res.Stderr)
	}
	return res.Stdout, nil
}

// fetched is what the node read from the store (compressed bytes).
func (n *benchNode) fetched() int64 {
	var b int64
	if n.layers != nil {
		b += n.layers.FetchedBytes()
	}
	if n.fs != nil {
		b += n.fs.Stats().FetchedBytes
	}
	if n.untar != nil {
		b += n.untar.fetched.Load()
	}
	return b
}

// diskBytes is what the node wrote to its disk: the blocks of every file
// under its directory, hard links once.
func (n *benchNode) diskBytes() int64 {
	var total int64
	seen := map[uint64]bool{}
	filepath.WalkDir(n.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && p != n.root {
			// Skip mounts: layer mounts, sandbox root filesystems, blobfs.
			if ok, _ := mount.IsMountpoint(p); ok {
				return filepath.SkipDir
			}
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok || seen[st.Ino] {
			return nil
		}
		seen[st.Ino] = true
		total += st.Blocks * 512
		return nil
	})
	return total
}

func (n *benchNode) close() {
	ctx := context.Background()
	if n.edge != nil {
		var wg sync.WaitGroup
		for _, id := range n.ids {
			wg.Add(1)
			go func() { defer wg.Done(); n.edge.Destroy(ctx, id) }()
		}
		wg.Wait()
	}
	if n.back != nil {
		n.back.Close()
	}
	if n.fs != nil {
		if err := n.fs.Close(); err != nil {
			// Its last EROFS user may linger: detach it, so nothing stays.
			syscall.Unmount(filepath.Join(n.root, "blobfs"), syscall.MNT_DETACH)
		}
	}
	os.RemoveAll(n.root)
}

// untarLayers is the untar-per-sandbox baseline: every sandbox gets its
// own copy of each layer, fetched as a tar.gz from the store and unpacked.
type untarLayers struct {
	store   blob.Store
	dir     string
	keys    map[string]string // layer digest → tar.gz object
	n       atomic.Int64
	fetched atomic.Int64
}

func (u *untarLayers) Fetch(ctx context.Context, digest string) (backend.Layer, error) {
	key, ok := u.keys[digest]
	if !ok {
		return backend.Layer{}, fmt.Errorf("no tarball of %s", digest)
	}
	info, err := u.store.Stat(ctx, key)
	if err != nil {
		return backend.Layer{}, err
	}
	rc, err := u.store.Get(ctx, key, 0, -1)
	if err != nil {
		return backend.Layer{}, err
	}
	defer rc.Close()
	dir := filepath.Join(u.dir, fmt.Sprint(u.n.Add(1)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return backend.Layer{}, err
	}
	if _, err := layer.ExtractTar(ctx, rc, dir, layer.Limits{}); err != nil {
		return backend.Layer{}, err
	}
	u.fetched.Add(info.Size)
	return backend.Layer{Digest: digest, Path: dir, Dir: true}, nil
}

// writeTarGz stores dir as a tar.gz object in the store.
func writeTarGz(ctx context.Context, bs blob.Store, key, dir, tmpDir string) (int64, error) {
	f, err := os.CreateTemp(tmpDir, "tgz-")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return nil // sockets: skip
		}
		h.Name = rel
		if d.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", ""
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			h.Uid, h.Gid = int(st.Uid), int(st.Gid)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, in)
			in.Close()
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		return 0, fmt.Errorf("tar %s: %w", dir, err)
	}
	size, _ := f.Seek(0, io.SeekCurrent)
	f.Seek(0, io.SeekStart)
	if err := bs.Put(ctx, key, f, size); err != nil {
		return 0, err
	}
	return size, nil
}

func edgeSnapshotRequest() edge.SnapshotRequest { return edge.SnapshotRequest{} }

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

func trim(s string) string { return strings.TrimSpace(s) }

func indent(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("      " + line + "\n")
	}
	return b.String()
}
