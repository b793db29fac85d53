// Package backendtest is the behaviour suite every backend.Backend passes:
// the container backend and the microVM backend. It drives the
// backend directly (no edge, no server) and talks to each sandbox's agent
// through Backend.Dial.
package backendtest

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/testutil"
)

// Fixture is what the suite needs from an implementation.
type Fixture struct {
	// New returns a backend over root. Called twice on one root, the second
	// backend plays the same node after a restart.
	New func(t *testing.T, root string) backend.Backend
	// Resources for each sandbox; small, so the suite fits anywhere.
	Resources api.Resources
	// OwnKernel says each sandbox runs its own kernel (a virtual machine):
	// its root is root of the guest, and nothing of the host's, so there
	// is no user namespace to check.
	OwnKernel bool
	// Base, if set, is the layer every sandbox boots instead of the
	// busybox base (a full VM boots a vm layer, a disk image).
	Base func(t *testing.T) backend.Layer
	// WholeDisk says a sandbox's layer is a whole disk (a full VM): its
	// disk is the image, not a bounded writable layer, and a snapshot is
	// a disk image (backend.DiskSnapshotter).
	WholeDisk bool
	// Lean runs the slow parts once: one reset of three, two parallel
	// creates of six (a boot under emulation takes tens of seconds).
	Lean bool
}

// MinimalLayer builds the busybox base layer into dir and returns it.
func MinimalLayer(t *testing.T, dir string) backend.Layer {
	t.Helper()
	ctx := context.Background()
	src := filepath.Join(dir, "base-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := layer.MinimalBase(ctx, "/bin/busybox", src); err != nil {
		t.Fatal(err)
	}
	img, err := layer.Build(ctx, src, filepath.Join(dir, "base.erofs"))
	if err != nil {
		t.Fatal(err)
	}
	return backend.Layer{Digest: img.Digest, Path: filepath.Join(dir, "base.erofs")}
}

// Run runs the suite.
func Run(t *testing.T, f Fixture) {
	var base backend.Layer
	if f.Base != nil {
		base = f.Base(t)
	} else {
		testutil.Require(t, testutil.Root, testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
		base = MinimalLayer(t, t.TempDir())
	}
	spec := func(id string) backend.Spec {
		return backend.Spec{
			ID: id, Layers: []backend.Layer{base}, Resources: f.Resources,
			Network: api.Network{Mode: api.NetworkNone}, Env: map[string]string{"SUITE": "yes"},
		}
	}

	t.Run("lifecycle", func(t *testing.T) {
		ctx := context.Background()
		b := f.New(t, t.TempDir())
		sp := spec(unique("life"))
		sp.Backend = b.Name()
		if err := b.Create(ctx, sp); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Destroy(context.Background(), sp.ID) })
		ag := agentOf(b, sp.ID)
		if out := run(t, ag, "echo $SUITE; cat /etc/hostname >/dev/null; echo dirty > /dirty"); out != "yes\n" {
			t.Fatalf("first exec: %q", out)
		}
		if err := b.Create(ctx, sp); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("second create with one id: %v", err)
		}
		if st, err := b.State(ctx, sp.ID); err != nil || st != api.StateRunning {
			t.Fatalf("state: %q %v", st, err)
		}

		if err := b.Pause(ctx, sp.ID); err != nil {
			t.Fatal(err)
		}
		if st, _ := b.State(ctx, sp.ID); st != api.StatePaused {
			t.Fatalf("state after pause: %q", st)
		}
		if err := b.Resume(ctx, sp.ID); err != nil {
			t.Fatal(err)
		}

		if err := b.Reset(ctx, sp.ID); err != nil {
			t.Fatal(err)
		}
		ag = agentOf(b, sp.ID)
		if out := run(t, ag, "test -e /dirty && echo dirty || echo clean"); out != "clean\n" {
			t.Fatalf("after reset: %q", out)
		}

		if err := b.Destroy(ctx, sp.ID); err != nil {
			t.Fatal(err)
		}
		if err := b.Destroy(ctx, sp.ID); err != nil {
			t.Fatalf("second destroy: %v", err)
		}
		if _, err := b.State(ctx, sp.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("state after destroy: %v", err)
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := agentOf(b, sp.ID).Health(dctx); err == nil {
			t.Fatal("agent still answers after destroy")
		}
	})

	t.Run("recycle", func(t *testing.T) { recycle(t, f, spec) })

	t.Run("reset leaves nothing behind", func(t *testing.T) { resetClean(t, f, spec) })

	t.Run("failed create leaves nothing and the id can be reused", func(t *testing.T) {
		ctx := context.Background()
		root := t.TempDir()
		b := f.New(t, root)
		sp := spec(unique("fail"))
		sp.Backend = b.Name()
		sp.Layers = []backend.Layer{{Digest: "sha256:" + strings.Repeat("0", 64), Path: filepath.Join(root, "missing.erofs")}}
		if err := b.Create(ctx, sp); err == nil {
			b.Destroy(ctx, sp.ID)
			t.Fatal("create with a missing layer image succeeded")
		}
		sp.Layers = []backend.Layer{base}
		if err := b.Create(ctx, sp); err != nil {
			t.Fatalf("create after a failed one: %v", err)
		}
		if err := b.Destroy(ctx, sp.ID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("recover after restart", func(t *testing.T) {
		ctx := context.Background()
		root := t.TempDir()
		b1 := f.New(t, root)
		sp := spec(unique("rec"))
		sp.Backend = b1.Name()
		if err := b1.Create(ctx, sp); err != nil {
			t.Fatal(err)
		}
		// Until the second backend has recovered the sandbox it is the
		// first's to destroy: a failure half way must not leave it
		// running (closing a backend leaves its sandboxes, by design).
		recovered := false
		t.Cleanup(func() {
			if !recovered {
				b1.Destroy(context.Background(), sp.ID)
			}
		})
		run(t, agentOf(b1, sp.ID), "echo kept > /kept")
		b2 := f.New(t, root) // the same node after an edge restart
		specs, err := b2.Recover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(specs) != 1 || specs[0].ID != sp.ID {
			t.Fatalf("recovered %+v", specs)
		}
		recovered = true
		t.Cleanup(func() { b2.Destroy(context.Background(), sp.ID) })
		if out := run(t, agentOf(b2, sp.ID), "cat /kept"); out != "kept\n" {
			t.Fatalf("after recover: %q", out)
		}
		if err := b2.Destroy(ctx, sp.ID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("limits: root is not root outside, the disk is bounded", func(t *testing.T) {
		if f.WholeDisk {
			t.Skip("a whole disk is its image grown to disk_mb: there is no small bound to hit, and root is the guest's own")
		}
		ctx := context.Background()
		b := f.New(t, t.TempDir())
		sp := spec(unique("lim"))
		sp.Backend = b.Name()
		sp.Resources.DiskMB = 32
		if err := b.Create(ctx, sp); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Destroy(context.Background(), sp.ID) })
		ag := agentOf(b, sp.ID)
		if out := run(t, ag, "awk '{print $1, $2 != 0}' /proc/self/uid_map"); out != "0 1\n" && !f.OwnKernel {
			t.Fatalf("uid_map: root inside maps to %q outside", out)
		}
		res, err := ag.Exec(ctx, &api.ExecRequest{Shell: "dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1"})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 || !strings.Contains(res.Stdout, "No space left") {
			t.Fatalf("wrote 64 MB into a 32 MB writable layer: %+v", res)
		}
		if err := b.Reset(ctx, sp.ID); err != nil {
			t.Fatal(err)
		}
		run(t, agentOf(b, sp.ID), "dd if=/dev/zero of=/tmp/f bs=1M count=8 2>/dev/null") // space is back
	})

	t.Run("policy phases", func(t *testing.T) {
		ctx := context.Background()
		b := f.New(t, t.TempDir())
		ph, ok := b.(backend.Phaser)
		if !ok {
			t.Skipf("backend %s has no policy phases", b.Name())
		}
		sp := spec(unique("phase"))
		sp.Backend = b.Name()
		sp.Phase = "agent"
		sp.Files = api.FileRules{Deny: []string{"/secret"}}
		if err := b.Create(ctx, sp); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Destroy(context.Background(), sp.ID) })
		ag := agentOf(b, sp.ID)
		res, err := ag.Exec(ctx, &api.ExecRequest{Shell: "mkdir /secret"})
		if err != nil || res.ExitCode == 0 {
			t.Fatalf("made a denied path in the first phase: %+v %v", res, err)
		}
		if err := ph.SetPhase(ctx, sp.ID, backend.Policy{Phase: "setup", Network: api.Network{Mode: api.NetworkNone}}); err != nil {
			t.Fatal(err)
		}
		run(t, ag, "mkdir /secret && echo s > /secret/f")
		if err := ph.SetPhase(ctx, sp.ID, backend.Policy{Phase: "agent", Network: api.Network{Mode: api.NetworkNone},
			Files: api.FileRules{Deny: []string{"/secret"}}}); err != nil {
			t.Fatal(err)
		}
		if res, err := ag.Exec(ctx, &api.ExecRequest{Shell: "cat /secret/f"}); err != nil || res.ExitCode == 0 {
			t.Fatalf("read a denied file after the switch: %+v %v", res, err)
		}
		if err := ph.SetPhase(ctx, sp.ID, backend.Policy{Phase: "x", Network: api.Network{Mode: api.NetworkOpen}}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("network for a sandbox made without: %v", err)
		}
	})

	t.Run("snapshot", func(t *testing.T) {
		if f.WholeDisk {
			testDiskSnapshot(t, f, spec)
			return
		}
		testSnapshot(t, f, spec)
	})

	t.Run("parallel creates", func(t *testing.T) {
		ctx := context.Background()
		b := f.New(t, t.TempDir())
		var wg sync.WaitGroup
		n := 6
		if f.Lean {
			n = 2
		}
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sp := spec(unique("par") + string(rune('a'+i)))
				sp.Backend = b.Name()
				if err := b.Create(ctx, sp); err != nil {
					errs <- err
					return
				}
				defer b.Destroy(ctx, sp.ID)
				res, err := agentOf(b, sp.ID).Exec(ctx, &api.ExecRequest{Shell: "echo ok"})
				if err == nil && res.Stdout != "ok\n" {
					err = errors.New("unexpected output " + res.Stdout)
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	})
}

var (
	uniqueMu sync.Mutex
	uniqueN  int
)

func unique(prefix string) string {
	uniqueMu.Lock()
	defer uniqueMu.Unlock()
	uniqueN++
	return prefix + "-" + filepath.Base(os.TempDir()) + "-" + itoa(os.Getpid()) + "-" + itoa(uniqueN)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func agentOf(b backend.Backend, id string) *agent.Client {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
}

func run(t *testing.T, ag *agent.Client, shell string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := ag.Exec(ctx, &api.ExecRequest{Shell: shell})
	if err != nil {
		t.Fatalf("exec %q: %v", shell, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d: %s", shell, res.ExitCode, res.Stderr)
	}
	return res.Stdout
}

// testSnapshot: the changes a snapshot hands to pack (added, modified and
// deleted files, a replaced directory), built into a layer and stacked on
// the original layers, give a new sandbox what the first one saw; the
// first runs on.
func testSnapshot(t *testing.T, f Fixture, spec func(string) backend.Spec) {
	ctx := context.Background()
	b := f.New(t, t.TempDir())
	sp := spec(unique("snap"))
	sp.Backend = b.Name()
	if err := b.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), sp.ID) })
	ag := agentOf(b, sp.ID)
	const view = "find /etc /srv | sort; cat /etc/hostname /srv/d/new; ls -l /etc/group 2>&1 | grep -c 'No such'"
	run(t, ag, "echo changed > /etc/hostname; rm /etc/group; mkdir -p /srv/d; echo new > /srv/d/new; rm -rf /root; echo file > /root")
	want := run(t, ag, view)
	img := filepath.Join(t.TempDir(), "snap.erofs")
	var built layer.Image
	err := b.Snapshot(ctx, sp.ID, 0, func(ctx context.Context, dirs []string) error {
		if len(dirs) != 1 {
			t.Errorf("pack got %d dirs, want the upper dir alone", len(dirs))
		}
		var err error
		built, err = layer.Build(ctx, dirs[0], img)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := b.State(ctx, sp.ID); err != nil || st != api.StateRunning {
		t.Fatalf("after snapshot: state %q, %v", st, err)
	}
	run(t, ag, "true")
	if err := b.Snapshot(ctx, sp.ID, 5, func(context.Context, []string) error { return nil }); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("snapshot merging more layers than the sandbox has: %v", err)
	}

	sp2 := spec(unique("fromsnap"))
	sp2.Backend = b.Name()
	sp2.Layers = append(sp2.Layers, backend.Layer{Digest: built.Digest, Path: img})
	if err := b.Create(ctx, sp2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), sp2.ID) })
	if got := run(t, agentOf(b, sp2.ID), view); got != want {
		t.Fatalf("sandbox on the snapshot sees\n%s\nwant\n%s", got, want)
	}
}
