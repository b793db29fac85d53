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
		if err := blobfs.Keep(context.Background(), spec[0], []string{os.Args[0], "-test.run=^$"}, slog.Default()); err != nil {
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
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
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
		// Killing the keeper ends the worker and the connection.
		keeper.Process.Kill()
		<-kept
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
