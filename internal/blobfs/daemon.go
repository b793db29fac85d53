package blobfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
)

// blobfs runs as processes of its own (`dsec blobfs`), apart from the
// edge: EROFS mounts of running sandboxes read through it, so it must
// outlive an edge that is restarted or killed, as the sandboxes do. It is
// two processes: a keeper, which mounts the file system, holds the
// /dev/fuse fd and does nothing else, and a worker, its child, which serves
// the fd it inherits. A worker that dies (kill -9, a crash) is started
// again by the keeper; the new one asks the kernel to resend the requests
// the dead one held (see fuse.go), so readers stall and never see EIO. A
// worker outlives its keeper, holding the connection open; the edge
// (Supervise) starts a keeper that adopts it. The edge finds it again
// through its directory:
//
//	<dir>/mnt               the FUSE mount
//	<dir>/blobfs.sock       the worker's HTTP: GET /metrics, /v1/stats, /v1/touched/<hex>, POST /v1/stop
//	<dir>/blobfs.pid        the keeper's process id
//	<dir>/blobfs.worker.pid the worker's process id
//	<dir>/blobfs.log        their log
const fuseSuperMagic = 0x65735546

// FDEnv names the environment variable that tells a worker which of its
// fds is the FUSE connection.
const FDEnv = "DSEC_BLOBFS_FD"

// Paths of a blobfs directory.
func MountDir(dir string) string      { return filepath.Join(dir, "mnt") }
func socketPath(dir string) string    { return filepath.Join(dir, "blobfs.sock") }
func pidPath(dir string) string       { return filepath.Join(dir, "blobfs.pid") }
func WorkerPidPath(dir string) string { return filepath.Join(dir, "blobfs.worker.pid") }

// Serve mounts a blobfs at MountDir(dir) served by this very process (no
// keeper) and serves its control socket until the file system is
// unmounted, or ctx ends and the mount is no longer in use (a mount EROFS
// still reads through is left serving).
func Serve(ctx context.Context, dir string, cfg Config) error {
	cfg.Mountpoint = MountDir(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cleanStale(cfg.Mountpoint)
	f, err := Mount(cfg)
	if err != nil {
		return err
	}
	stop, err := serveControl(dir, f)
	if err != nil {
		f.Close()
		return err
	}
	defer stop()
	if err := os.WriteFile(pidPath(dir), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		f.Close()
		return err
	}
	defer os.Remove(pidPath(dir))
	for {
		select {
		case <-f.conn.done:
			return nil
		case <-ctx.Done():
		}
		if err := f.Close(); err == nil {
			return nil
		} else {
			cfg.Logger.Warn("blobfs still in use; serving on", "err", err)
		}
		select {
		case <-f.conn.done:
			return nil
		case <-time.After(30 * time.Second):
		}
	}
}

// serveControl serves the control socket of dir for f; stop ends it.
func serveControl(dir string, f *FS) (stop func(), err error) {
	sock := socketPath(dir)
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/", f.Handler())
	mux.HandleFunc("POST /v1/stop", func(w http.ResponseWriter, r *http.Request) {
		if err := f.Unmount(); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	return func() {
		// Let a stop request that ended the mount have its answer.
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}, nil
}

// Work is a keeper's worker: it serves the FUSE connection fd of the
// mount at MountDir(dir), taking it over from a worker that died, and the
// control socket. It returns nil when the file system was unmounted.
func Work(ctx context.Context, dir string, fd int, cfg Config) error {
	cfg.Mountpoint = MountDir(dir)
	f, err := newFS(cfg)
	if err != nil {
		return err
	}
	if err := f.serve(fd, true); err != nil {
		return err
	}
	stop, err := serveControl(dir, f)
	if err != nil {
		return err
	}
	defer stop()
	if err := os.WriteFile(WorkerPidPath(dir), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return err
	}
	return f.conn.wait(ctx)
}

// Handler serves the control API.
func (f *FS) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(f.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(f.Stats())
	})
	mux.HandleFunc("GET /v1/touched/{hex}", func(w http.ResponseWriter, r *http.Request) {
		hot, ok := f.Touched(r.PathValue("hex"))
		if !ok {
			http.Error(w, "layer not served", http.StatusNotFound)
			return
		}
		json.NewEncoder(w).Encode(hot)
	})
	return mux
}

// alive reports whether a blobfs serves the mount at mp.
func alive(mp string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(mp, &st); err != nil || st.Type != fuseSuperMagic {
		return false
	}
	_, err := os.ReadDir(mp)
	return err == nil
}

// cleanStale detaches a dead blobfs mount (its server gone: ENOTCONN).
func cleanStale(mp string) {
	var st unix.Statfs_t
	if err := unix.Statfs(mp, &st); errors.Is(err, unix.ENOTCONN) || (err == nil && st.Type == fuseSuperMagic && !alive(mp)) {
		unix.Unmount(mp, unix.MNT_DETACH)
	}
}

// EnsureDaemon starts `argv... ` (a command running Serve on dir) in a
// session of its own unless a live blobfs already serves dir, and waits
// until its mount answers. env is added to the process's environment (the
// store's credentials travel there, not on the command line).
func EnsureDaemon(ctx context.Context, dir string, argv []string, env []string, log *slog.Logger) error {
	if alive(MountDir(dir)) {
		log.Info("blobfs already running", "dir", dir)
		return nil
	}
	cleanStale(MountDir(dir))
	return startDaemon(ctx, dir, argv, env, log)
}

// startDaemon starts a keeper, `argv...`, in a session of its own and
// waits until it has written its pid and its mount answers.
func startDaemon(ctx context.Context, dir string, argv []string, env []string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "blobfs.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: a signal to the edge's process group, or the
	// edge's death, must not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start blobfs: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(30 * time.Second)
	for readPid(pidPath(dir)) != cmd.Process.Pid || !alive(MountDir(dir)) {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, "blobfs.log"))
			return fmt.Errorf("blobfs exited (%v): %s", err, lastLines(b, 10))
		case <-deadline:
			return fmt.Errorf("blobfs did not mount %s in 30s", MountDir(dir))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	log.Info("blobfs started", "dir", dir, "pid", cmd.Process.Pid)
	return nil
}

func lastLines(b []byte, n int) string {
	lines := 0
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' {
			lines++
			if lines > n {
				return string(b[i+1:])
			}
		}
	}
	return string(b)
}

// StopDaemon asks the blobfs serving dir to unmount and exit, which it
// does only if nothing reads through it any more: no layer mounted over
// it, no blob open. It reports whether none serves dir now; a blobfs still
// in use (sandboxes that outlive their edge) is left serving.
func StopDaemon(ctx context.Context, dir string) (stopped bool, err error) {
	if !alive(MountDir(dir)) {
		return true, nil
	}
	c := daemonClient(dir)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://blobfs/v1/stop", nil)
	resp, err := c.Do(req)
	if err != nil {
		return false, fmt.Errorf("stop blobfs: %w", err)
	}
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusConflict:
		return false, nil
	default:
		return false, fmt.Errorf("stop blobfs: %s", resp.Status)
	}
	// The mount is gone; wait for the process to remove its pid file.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(pidPath(dir)); errors.Is(err, os.ErrNotExist) {
			return true, nil
		}
	}
	return true, nil
}

// DaemonTouched asks the blobfs serving dir for the chunks of a layer's
// blob read so far, in first-read order.
func DaemonTouched(ctx context.Context, dir, hex string) ([]int, error) {
	var hot []int
	if err := daemonGet(ctx, dir, "/v1/touched/"+hex, &hot); err != nil {
		return nil, fmt.Errorf("blobfs touched chunks of %s: %w", hex, err)
	}
	return hot, nil
}

// DaemonStats asks the blobfs serving dir for its counters.
func DaemonStats(ctx context.Context, dir string) (Stats, error) {
	var s Stats
	if err := daemonGet(ctx, dir, "/v1/stats", &s); err != nil {
		return Stats{}, fmt.Errorf("blobfs stats: %w", err)
	}
	return s, nil
}

// daemonClient talks to the control socket of the blobfs serving dir.
func daemonClient(dir string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socketPath(dir))
	}}}
}

func daemonGet(ctx context.Context, dir, path string, out any) error {
	c := daemonClient(dir)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://blobfs"+path, nil)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
