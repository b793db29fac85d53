package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/image"
	"github.com/dsec-project/dsec/internal/layer"
)

// ImageConfig sets up `dsec bench image`.
type ImageConfig struct {
	// Store is the shared layer store the nodes fetch from.
	Store blob.Store
	// Rootfs is a Debian tree (debootstrap bookworm with python3,
	// python3-pip and git) for the debian:12 base; built if empty.
	Rootfs string
	// Repo is a git repository for the workspace layer.
	Repo string
	// N sandboxes start at once, Concurrency of them at a time.
	N, Concurrency int
	// SnapshotMB is how much a sandbox changes before pack_diff.
	SnapshotMB int
	// Parts picks what to run: any of "a", "b", "c" (all by default).
	Parts     string
	AgentPath string
	WorkDir   string
	Out       io.Writer

	tarKeys map[string]string
}

// session is the realistic agent turn of part (a).
const session = `cat > /tmp/task.py <<'PY'
import json, re, collections, pathlib, subprocess
words = collections.Counter(re.findall(r"[a-z]+", pathlib.Path("/work/repo/README.md").read_text().lower()))
print(json.dumps(words.most_common(3)))
PY
python3 /tmp/task.py && cd /work/repo && git status --short | wc -l && git log --oneline | head -1 && pip --version`

// readyCmd is what proves a sandbox ready in part (b): the interpreter
// the agent harness would start.
const readyCmd = `python3 -c "import json, os; print(os.getpid())"`

// Image runs the image benchmark and prints its report.
func Image(ctx context.Context, cfg ImageConfig) error {
	w := cfg.Out
	st, err := layer.NewStore(cfg.Store, filepath.Join(cfg.WorkDir, "build"))
	if err != nil {
		return err
	}
	base, ws, err := buildLayers(ctx, &cfg, st)
	if err != nil {
		return err
	}
	stack := []string{base.Digest, ws.Digest}
	total, stored, err := layerSizes(ctx, st, stack)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "layers: debian:12 %s + workspace %s = %s uncompressed, %s in the store (zstd, deduplicated)\n\n",
		mb(base.Size), mb(ws.Size), mb(total), mb(stored))

	if cfg.Parts == "" {
		cfg.Parts = "abc"
	}
	if strings.Contains(cfg.Parts, "a") {
		if err := sessionBytes(ctx, cfg, st, stack, total, stored); err != nil {
			return err
		}
	}
	if strings.Contains(cfg.Parts, "b") {
		if err := bursts(ctx, cfg, st, stack); err != nil {
			return err
		}
	}
	if strings.Contains(cfg.Parts, "c") {
		return packDiff(ctx, cfg, st, stack)
	}
	return nil
}

// sessionBytes is part (a): bytes fetched for a realistic session, on a
// cold node.
func sessionBytes(ctx context.Context, cfg ImageConfig, st *layer.Store, stack []string, total, stored int64) error {
	w := cfg.Out
	n, err := newBenchNode(ctx, cfg, st, modeOnDemand, "session")
	if err != nil {
		return err
	}
	t0 := time.Now()
	err = n.start(ctx, "bench-session", stack, "true")
	var out string
	if err == nil {
		out, err = n.sh(ctx, "bench-session", session)
	}
	elapsed := time.Since(t0)
	fetched, bs := n.fetched(), n.fs.Stats()
	metaFetched := n.layers.FetchedBytes()
	hot := map[string][]int{}
	for _, d := range stack {
		if h, ok := n.fs.Touched(d[len("sha256:"):]); ok {
			hot[d] = h
		}
	}
	n.close()
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	fmt.Fprintf(w, "(a) session (python script, git status, pip --version) in %s; output:\n%s", elapsed.Round(time.Millisecond), indent(out))
	fmt.Fprintf(w, "    fetched from the store: %s (metadata %s + %d chunks %s) of %s stored = %.1f%%\n",
		mb(fetched), mb(metaFetched), bs.FetchedChunks, mb(bs.FetchedBytes), mb(stored), 100*float64(fetched)/float64(stored))
	fmt.Fprintf(w, "    uncompressed: %s of chunks fetched, %s read by EROFS, of %s = %.1f%% (goal ≤ 15%%)\n",
		mb(bs.FetchedRaw), mb(bs.ReadBytes), mb(total), 100*float64(bs.FetchedRaw)/float64(total))
	return prefetchRun(ctx, cfg, st, stack, hot, elapsed)
}

// prefetchRun records the first session's chunks as the layers' hot lists,
// runs the session again on another cold node that prefetches them, and
// removes the lists (parts b and c run without them).
func prefetchRun(ctx context.Context, cfg ImageConfig, st *layer.Store, stack []string, hot map[string][]int, first time.Duration) error {
	for d, h := range hot {
		if err := st.PutPrefetch(ctx, d, h); err != nil {
			return err
		}
		defer st.Blobs().Delete(context.WithoutCancel(ctx), layer.PrefetchKey(d))
	}
	n, err := newBenchNode(ctx, cfg, st, modeOnDemand, "prefetch")
	if err != nil {
		return err
	}
	defer n.close()
	t0 := time.Now()
	err = n.start(ctx, "bench-prefetch", stack, "true")
	if err == nil {
		_, err = n.sh(ctx, "bench-prefetch", session)
	}
	if err != nil {
		return fmt.Errorf("session with prefetch: %w", err)
	}
	d := time.Since(t0)
	s := n.fs.Stats()
	fmt.Fprintf(cfg.Out, "    again on a cold node with the first run's chunks as hot lists: %s instead of %s (%d chunks prefetched, %d cache hits, %d misses)\n\n",
		d.Round(time.Millisecond), first.Round(time.Millisecond), s.Prefetched, s.CacheHits, s.CacheMisses)
	return nil
}

// bursts is part (b): N sandboxes on a cold node, three ways.
func bursts(ctx context.Context, cfg ImageConfig, st *layer.Store, stack []string) error {
	w := cfg.Out
	fmt.Fprintf(w, "(b) %d sandboxes (%d at a time) on a cold node, each ready when `%s` ran:\n", cfg.N, cfg.Concurrency, readyCmd)
	fmt.Fprintf(w, "    %-24s %12s %14s %14s\n", "mode", "all ready", "node disk", "fetched")
	res := map[string]burstResult{}
	for _, mode := range []string{modeOnDemand, modeFull, modeUntar} {
		r, err := burst(ctx, cfg, st, mode, stack)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		res[mode] = r
		fmt.Fprintf(w, "    %-24s %12s %14s %14s\n", mode, r.wall.Round(time.Millisecond), mb(r.disk), mb(r.fetch))
	}
	od, full, untar := res[modeOnDemand], res[modeFull], res[modeUntar]
	fmt.Fprintf(w, "    on-demand vs full copy: %.2f× faster (goal ≥ 1.71×), %.0f%% fewer bytes written (goal ≥ 57%%)\n",
		full.wall.Seconds()/od.wall.Seconds(), 100*(1-float64(od.disk)/float64(full.disk)))
	fmt.Fprintf(w, "    on-demand vs untar:     %.2f× faster, %.1f× fewer bytes written (goal ≥ 5.5×)\n\n",
		untar.wall.Seconds()/od.wall.Seconds(), float64(untar.disk)/float64(od.disk))
	return nil
}

type burstResult struct {
	wall        time.Duration
	disk, fetch int64
}

// burst starts cfg.N sandboxes on a fresh node and reports the time until
// all are ready, what the node wrote to its disk, and what it fetched.
func burst(ctx context.Context, cfg ImageConfig, st *layer.Store, mode string, stack []string) (burstResult, error) {
	n, err := newBenchNode(ctx, cfg, st, mode, "burst")
	if err != nil {
		return burstResult{}, err
	}
	defer n.close()
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range cfg.N {
		id := fmt.Sprintf("bench-%d-%d", time.Now().UnixNano()%1e6, i)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := n.start(ctx, id, stack, readyCmd); err != nil {
				mu.Lock()
				firstErr = errors.Join(firstErr, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	if firstErr != nil {
		return burstResult{}, firstErr
	}
	// Writes still in the page cache count: they will reach the disk.
	return burstResult{wall: wall, disk: n.diskBytes(), fetch: n.fetched()}, nil
}

// packDiff is part (c): a sandbox changes SnapshotMB, is snapshotted, and
// a sandbox starts from the snapshot and from the original stack, each on
// a cold node.
func packDiff(ctx context.Context, cfg ImageConfig, st *layer.Store, stack []string) error {
	w := cfg.Out
	n, err := newBenchNode(ctx, cfg, st, modeOnDemand, "packdiff")
	if err != nil {
		return err
	}
	defer n.close()
	if err := n.start(ctx, "bench-pd", stack, "true"); err != nil {
		return err
	}
	change := fmt.Sprintf(`set -e; mkdir -p /opt/env && rm -rf /usr/share/doc/* &&
		head -c %dM /dev/urandom > /opt/env/weights.bin && i=0; while [ $(du -sm /opt/env | cut -f1) -lt %d ]; do
		i=$((i+1)); cp -a /usr/lib/python3 /opt/env/lib$i; done; du -sm /opt/env | cut -f1`, cfg.SnapshotMB/2, cfg.SnapshotMB)
	out, err := n.sh(ctx, "bench-pd", change)
	if err != nil {
		return err
	}
	t0 := time.Now()
	snap, err := n.edge.Snapshot(ctx, "bench-pd", edgeSnapshotRequest())
	if err != nil {
		return err
	}
	took := time.Since(t0)
	fmt.Fprintf(w, "(c) pack_diff of %s MB of changes (random data, copies of the python tree, /usr/share/doc removed): %s, layer %s\n",
		trim(out), took.Round(time.Millisecond), mb(snap.Size))
	for _, c := range []struct {
		name   string
		layers []string
	}{{"original stack", stack}, {"from the snapshot", append(append([]string(nil), stack...), snap.Digest)}} {
		m, err := newBenchNode(ctx, cfg, st, modeOnDemand, "start")
		if err != nil {
			return err
		}
		t0 := time.Now()
		err = m.start(ctx, "bench-start", c.layers, readyCmd)
		d := time.Since(t0)
		m.close()
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "    cold node, create + first python3, %-18s %s\n", c.name+":", d.Round(time.Millisecond))
	}
	return nil
}

// buildLayers makes the debian:12 base and the workspace layers in the
// store, and their tar.gz copies for the untar baseline.
func buildLayers(ctx context.Context, cfg *ImageConfig, st *layer.Store) (layer.Desc, layer.Desc, error) {
	rootfs := cfg.Rootfs
	if rootfs == "" {
		rootfs = filepath.Join(cfg.WorkDir, "debian")
		fmt.Fprintf(cfg.Out, "debootstrap bookworm into %s...\n", rootfs)
		if err := image.Debootstrap(ctx, "bookworm", []string{"python3", "python3-pip", "git"}, "", rootfs); err != nil {
			return layer.Desc{}, layer.Desc{}, err
		}
	}
	wsDir := filepath.Join(cfg.WorkDir, "workspace")
	os.RemoveAll(wsDir)
	if err := image.GitWorkspace(ctx, cfg.Repo, "", wsDir, "/work/repo"); err != nil {
		return layer.Desc{}, layer.Desc{}, err
	}
	t0 := time.Now()
	base, err := st.Build(ctx, rootfs)
	if err != nil {
		return layer.Desc{}, layer.Desc{}, err
	}
	ws, err := st.Build(ctx, wsDir)
	if err != nil {
		return layer.Desc{}, layer.Desc{}, err
	}
	fmt.Fprintf(cfg.Out, "built both layers into the store in %s\n", time.Since(t0).Round(time.Millisecond))
	cfg.tarKeys = map[string]string{}
	for _, l := range []struct {
		d   layer.Desc
		dir string
	}{{base, rootfs}, {ws, wsDir}} {
		key := "bench/tgz/" + l.d.Digest[len("sha256:"):]
		if _, err := cfg.Store.Stat(ctx, key); err != nil {
			if _, err := writeTarGz(ctx, cfg.Store, key, l.dir, cfg.WorkDir); err != nil {
				return layer.Desc{}, layer.Desc{}, err
			}
		}
		cfg.tarKeys[l.d.Digest] = key
	}
	return base, ws, nil
}

// layerSizes sums the layers' uncompressed sizes and the compressed bytes
// of their distinct chunks in the store.
func layerSizes(ctx context.Context, st *layer.Store, digests []string) (total, stored int64, err error) {
	seen := map[string]bool{}
	for _, d := range digests {
		m, _, err := st.Manifest(ctx, d)
		if err != nil {
			return 0, 0, err
		}
		total += m.Total()
		for _, p := range []*layer.Part{&m.Meta, m.Blob} {
			if p == nil {
				continue
			}
			for _, c := range p.Chunks {
				if seen[c.Digest] {
					continue
				}
				seen[c.Digest] = true
				info, err := st.Blobs().Stat(ctx, layer.ChunkKey(c.Digest))
				if err != nil {
					return 0, 0, err
				}
				stored += info.Size
			}
		}
	}
	return total, stored, nil
}

// RepoFromDir makes a git repository of a source tree (a Go module from
// the module cache, say) in dst, one commit, for the workspace layer.
func RepoFromDir(ctx context.Context, src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := exec.CommandContext(ctx, "cp", "-a", src+"/.", dst).Run(); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	exec.Command("chmod", "-R", "u+w", dst).Run()
	env := append(os.Environ(), "GIT_AUTHOR_NAME=bench", "GIT_AUTHOR_EMAIL=bench@dsec", "GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@dsec")
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"commit", "-qm", "import"}} {
		cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dst}, args...)...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %v: %w: %s", args, err, out)
		}
	}
	return nil
}
