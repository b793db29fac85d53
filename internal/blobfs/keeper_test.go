package blobfs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/blob/local"
	"github.com/dsec-project/dsec/internal/blobfs"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/testutil"
)

// The test binary doubles as a blobfs worker when started by a keeper
// with workerEnv set: DSEC_TEST_BLOBFS_WORKER=<dir>|<store>|<manifests>|<cache>.
const workerEnv = "DSEC_TEST_BLOBFS_WORKER"

// keeperEnv makes the test binary a keeper: a process of its own, as in
// production. (A keeper that had blobfs files open itself would deadlock:
// starting a worker closes its copies of them, and the FLUSH of that close
// waits for the worker it is starting.)
const keeperEnv = "DSEC_TEST_BLOBFS_KEEPER"

func TestMain(m *testing.M) {
	if os.Getenv(keeperEnv) != "" {
		spec := strings.Split(os.Getenv(workerEnv), "|")
		os.Unsetenv(keeperEnv) // its workers are workers
		adopt, _ := strconv.Atoi(os.Getenv(blobfs.AdoptEnv))
		if err := blobfs.Keep(context.Background(), spec[0], []string{os.Args[0], "-test.run=^$"}, adopt, slog.Default()); err != nil {
			fmt.Fprintln(os.Stderr, "test keeper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(runTestWorker(spec))
	}
	os.Exit(m.Run())
}

// slowSource delays every chunk fetch, so that reads are in flight when
// the worker is killed.
type slowSource struct{ *layer.Store }

func (s slowSource) ReadChunk(ctx context.Context, c layer.Chunk) ([]byte, int64, error) {
	select {
	case <-time.After(3 * time.Millisecond):
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	return s.Store.ReadChunk(ctx, c)
}

func runTestWorker(spec string) int {
	p := strings.Split(spec, "|")
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "test worker:", err); return 1 }
	bs, err := local.Open(p[1])
	if err != nil {
		return fail(err)
	}
	st, err := layer.NewStore(bs, filepath.Join(p[0], "tmp"))
	if err != nil {
		return fail(err)
	}
	fd, err := strconv.Atoi(os.Getenv(blobfs.FDEnv))
	if err != nil {
		return fail(err)
	}
	err = blobfs.Work(context.Background(), p[0], fd, blobfs.Config{
		ManifestDir: p[2], CacheDir: p[3], CacheMax: 1 << 20, Source: slowSource{st},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return fail(err)
	}
	return 0
}

// TestWorkerKilledUnderReads: the blobfs worker is killed with SIGKILL
// 50 times while readers read cold parts of a layer's blob; the keeper
// starts another on the same FUSE connection, which has the kernel resend
// the requests in flight. Every read returns the right bytes; none fails.
func TestWorkerKilledUnderReads(t *testing.T) {
	fx := newFixture(t, 1<<30)
	dir := t.TempDir()
	t.Setenv(workerEnv, strings.Join([]string{dir, fx.storeDir, fx.manifests, filepath.Join(dir, "cache")}, "|"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	keeper := exec.Command(os.Args[0], "-test.run=^$")
	keeper.Env = append(os.Environ(), keeperEnv+"=1")
	keeper.Stderr = os.Stderr
	if err := keeper.Start(); err != nil {
		t.Fatal(err)
	}
	kept := make(chan error, 1)
	go func() { kept <- keeper.Wait() }()
	t.Cleanup(func() {
		// A worker outlives its keeper: kill both.
		keeper.Process.Kill()
		<-kept
		killPidFile(blobfs.WorkerPidPath(dir))
		unix.Unmount(blobfs.MountDir(dir), unix.MNT_DETACH)
	})
	blob := filepath.Join(blobfs.MountDir(dir), strings.TrimPrefix(fx.digest, "sha256:"))
	testutil.Eventually(t, 10*time.Second, "blobfs up", func() error {
		_, err := os.Stat(blob)
		return err
	})

	var kills, reads, straddled atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	size := int64(len(fx.blob))
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(blob)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			r := mrand.New(mrand.NewPCG(uint64(g), 2))
			for {
				select {
				case <-stop:
					return
				default:
				}
				off := r.Int64N(size)
				n := min(r.Int64N(64<<10)+1, size-off)
				buf := make([]byte, n)
				before := kills.Load()
				if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
					errs <- fmt.Errorf("read %d+%d after %d kills: %w", off, n, before, err)
					return
				}
				if !bytes.Equal(buf, fx.blob[off:off+n]) {
					errs <- fmt.Errorf("wrong bytes at %d+%d after %d kills", off, n, before)
					return
				}
				reads.Add(1)
				if kills.Load() != before {
					straddled.Add(1)
				}
			}
		}()
	}

	ctxDeadline, _ := ctx.Deadline()
	last := 0
	for range 50 {
		pid := 0
		if testutil.Poll(time.Until(ctxDeadline), func() error {
			b, _ := os.ReadFile(blobfs.WorkerPidPath(dir))
			if pid, _ = strconv.Atoi(strings.TrimSpace(string(b))); pid == 0 || pid == last {
				return errors.New("no new worker")
			}
			return nil
		}) != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("no new worker after %d kills", kills.Load())
		}
		// sleep: a kill at a random moment among the reads is the case under test
		time.Sleep(time.Duration(20+mrand.IntN(60)) * time.Millisecond)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill worker %d: %v", pid, err)
		}
		kills.Add(1)
		last = pid
	}
	// Reads go on after the last kill.
	after := reads.Load()
	_ = testutil.Poll(time.Until(ctxDeadline), func() error {
		if reads.Load() < after+20 {
			return errors.New("fewer than 20 reads after the last kill")
		}
		return nil
	})
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d kills, %d reads, %d of them across a kill", kills.Load(), reads.Load(), straddled.Load())
	if reads.Load() < after+20 {
		t.Errorf("reads stalled after the last kill: %d then %d", after, reads.Load())
	}
	if straddled.Load() == 0 {
		t.Error("no read was in flight across a kill: the test tested nothing")
	}

	// With no reader left, a stop ends keeper and worker.
	if stopped, err := blobfs.StopDaemon(ctx, dir); err != nil || !stopped {
		t.Fatalf("stop = %v, %v", stopped, err)
	}
	select {
	case err := <-kept:
		kept <- err // for the cleanup
		if err != nil {
			t.Fatalf("keeper: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("keeper did not end after the stop")
	}
}

// killPidFile kill -9s the process of a pid file, if any.
func killPidFile(path string) int {
	b, _ := os.ReadFile(path)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid > 0 {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return pid
}

// readPidFile reads a pid file; 0 if there is none.
func readPidFile(path string) int {
	b, _ := os.ReadFile(path)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// TestKeeperKilledUnderReads: the keeper is killed with SIGKILL while
// readers read cold parts of a blob through an open file (a running
// sandbox's layer); its worker serves on, and the edge's Supervise starts
// a keeper that adopts the worker's FUSE connection, so no read fails and
// the mount stays. Three times; then the adopted worker is killed and the
// new keeper starts another; a new open (a new create) reads right. If the
// worker dies too while no keeper holds the connection, the connection
// ends: a file opened on it fails with a clear error (ENOTCONN), and
// Supervise mounts anew, where new opens read right.
func TestKeeperKilledUnderReads(t *testing.T) {
	fx := newFixture(t, 1<<30)
	dir := t.TempDir()
	t.Setenv(workerEnv, strings.Join([]string{dir, fx.storeDir, fx.manifests, filepath.Join(dir, "cache")}, "|"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	argv, env := []string{os.Args[0], "-test.run=^$"}, []string{keeperEnv + "=1"}
	if err := blobfs.EnsureDaemon(ctx, dir, argv, env, log); err != nil {
		t.Fatal(err)
	}
	supervise := func() (stop func()) {
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); blobfs.Supervise(sctx, dir, argv, env, log) }()
		return func() { cancel(); <-done }
	}
	stopSupervisor := supervise()
	t.Cleanup(func() {
		stopSupervisor()
		killPidFile(filepath.Join(dir, "blobfs.pid"))
		killPidFile(blobfs.WorkerPidPath(dir))
		unix.Unmount(blobfs.MountDir(dir), unix.MNT_DETACH)
	})
	blob := filepath.Join(blobfs.MountDir(dir), strings.TrimPrefix(fx.digest, "sha256:"))
	size := int64(len(fx.blob))
	readAt := func(f *os.File, r *mrand.Rand) error {
		off := r.Int64N(size)
		n := min(r.Int64N(64<<10)+1, size-off)
		buf := make([]byte, n)
		if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read %d+%d: %w", off, n, err)
		}
		if !bytes.Equal(buf, fx.blob[off:off+n]) {
			return fmt.Errorf("wrong bytes at %d+%d", off, n)
		}
		return nil
	}

	var reads atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(blob)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			r := mrand.New(mrand.NewPCG(uint64(g), 3))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := readAt(f, r); err != nil {
					errs <- err
					return
				}
				reads.Add(1)
			}
		}()
	}
	moreReads := func(what string) {
		t.Helper()
		after := reads.Load()
		testutil.EventuallyTrue(t, 20*time.Second, "reading on "+what, func() bool {
			select {
			case err := <-errs:
				t.Fatal(err)
			default:
			}
			return reads.Load() >= after+20
		})
	}
	newPid := func(path string, old int) int {
		t.Helper()
		var pid int
		testutil.EventuallyTrue(t, 20*time.Second, "a new process in "+filepath.Base(path), func() bool {
			pid = readPidFile(path)
			return pid != 0 && pid != old && syscall.Kill(pid, 0) == nil
		})
		return pid
	}

	moreReads("the first keeper")
	keeperPid := filepath.Join(dir, "blobfs.pid")
	for i := range 3 {
		old := killPidFile(keeperPid)
		newPid(keeperPid, old)
		moreReads(fmt.Sprintf("keeper %d", i+2))
	}
	// The adopted worker dies: the adopting keeper starts its own.
	newPid(blobfs.WorkerPidPath(dir), killPidFile(blobfs.WorkerPidPath(dir)))
	moreReads("a worker of an adopting keeper")
	f, err := os.Open(blob)
	if err != nil {
		t.Fatalf("open after the kills: %v", err)
	}
	if err := readAt(f, mrand.New(mrand.NewPCG(9, 9))); err != nil {
		t.Fatalf("new open after the kills: %v", err)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Keeper and worker both gone, no supervisor meanwhile: the
	// connection ends with its last fd.
	stopSupervisor()
	old := killPidFile(keeperPid)
	testutil.EventuallyTrue(t, 10*time.Second, "the keeper gone", func() bool { return syscall.Kill(old, 0) != nil })
	killPidFile(blobfs.WorkerPidPath(dir))
	_, err = f.ReadAt(make([]byte, 4096), size/2)
	if !errors.Is(err, syscall.ENOTCONN) && !errors.Is(err, syscall.ECONNABORTED) {
		t.Errorf("a read on the ended connection: %v, want ENOTCONN", err)
	}
	f.Close()
	stopSupervisor = supervise()
	newPid(keeperPid, old)
	f2, err := os.Open(blob)
	if err != nil {
		t.Fatalf("open on the new mount: %v", err)
	}
	if err := readAt(f2, mrand.New(mrand.NewPCG(7, 7))); err != nil {
		t.Fatalf("read on the new mount: %v", err)
	}
	f2.Close()

	stopSupervisor()
	if stopped, err := blobfs.StopDaemon(ctx, dir); err != nil || !stopped {
		t.Fatalf("stop = %v, %v", stopped, err)
	}
	stopSupervisor = func() {}
}
