package testutil

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/client"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// RepoRoot is the root of the dsec source tree.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Binaries builds dsec and a static dsec-agent once per test process and
// returns the directory holding both. The directory is one per source
// tree (test processes of other checkouts on the machine get their own),
// shared by every test process of this tree and kept between runs, so
// that tests leave nothing behind; each build lands by an atomic rename,
// and a process that already runs an older binary keeps running it.
func Binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := filepath.Abs(RepoRoot())
		if err != nil {
			buildErr = err
			return
		}
		sum := sha256.Sum256([]byte(root))
		binDir = filepath.Join(os.TempDir(), "dsec-test-bin-"+hex.EncodeToString(sum[:6]))
		if buildErr = os.MkdirAll(binDir, 0o755); buildErr != nil {
			return
		}
		for _, b := range []struct{ out, pkg string }{
			{"dsec-agent", "./cmd/dsec-agent"}, {"dsec", "./cmd/dsec"},
		} {
			tmp := filepath.Join(binDir, fmt.Sprintf(".%s.%d", b.out, os.Getpid()))
			cmd := exec.Command("go", "build", "-o", tmp, b.pkg)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				os.Remove(tmp)
				buildErr = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
				return
			}
			if err := os.Rename(tmp, filepath.Join(binDir, b.out)); err != nil {
				os.Remove(tmp)
				buildErr = err
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// Server is a real `dsec server` process for end-to-end tests.
type Server struct {
	URL     string
	Key     string // the admin key
	DataDir string
	// CgroupParent is the server's own cgroup parent, so that leak checks
	// see only its sandboxes.
	CgroupParent string
	Client       *client.Client // with the admin key

	t    testing.TB
	args []string
	cmd  *exec.Cmd
	done chan struct{}
	logs *os.File
}

// ServerRequirements are what StartServer needs from the machine.
var ServerRequirements = []Requirement{Root, Tool("runc"), Tool("mkfs.erofs"), File("/bin/busybox"), Filesystem("erofs"), Filesystem("overlay")}

// StartServer starts `dsec server` on a free port with its own data dir and
// returns when it serves. extra flags are passed through. At the end of the
// test every sandbox it made is destroyed and the server stopped, so tests
// leave nothing behind even when they fail.
func StartServer(t testing.TB, extra ...string) *Server {
	t.Helper()
	Require(t, ServerRequirements...)
	bin := Binaries(t)
	data, err := os.MkdirTemp("", "dsec-test-data-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{DataDir: data, t: t, CgroupParent: "dsec-test-" + filepath.Base(data)}
	// Tests make many sandboxes with the default 10 GiB disk_mb, which a
	// test machine's disk cannot hold promised one for one (writable
	// layers are sparse): its disk is overcommitted unless a test asks
	// otherwise (a later flag wins).
	s.args = append([]string{"server", "--data", data, "--listen", "127.0.0.1:0",
		"--node-id", "test-node", "--agent", filepath.Join(bin, "dsec-agent"),
		"--cgroup-parent", s.CgroupParent, "--microvm-kernel", GuestKernelDir(), "--disk-overcommit", "1000"}, extra...)
	s.start()
	t.Cleanup(s.cleanup)
	return s
}

var readyRE = regexp.MustCompile(`msg="dsec server ready" addr=(\S+)`)

func (s *Server) start() {
	t := s.t
	t.Helper()
	logs, err := os.OpenFile(filepath.Join(s.DataDir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	s.logs = logs
	cmd := exec.Command(filepath.Join(Binaries(t), "dsec"), s.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logs, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	s.cmd, s.done = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(s.done) }()

	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logs, line)
			if m := readyRE.FindStringSubmatch(line); m != nil && !sent {
				addr <- m[1]
				sent = true
			}
		}
		if !sent {
			close(addr)
		}
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatalf("dsec server exited before it was ready:\n%s", s.Logs())
		}
		s.URL = "http://" + a
	case <-time.After(60 * time.Second):
		t.Fatalf("dsec server not ready after 60s:\n%s", s.Logs())
	}
	key, err := os.ReadFile(filepath.Join(s.DataDir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	s.Key = strings.TrimSpace(string(key))
	s.Client = client.New(s.URL, s.Key)
}

// Logs returns what the server logged so far.
func (s *Server) Logs() string {
	b, _ := os.ReadFile(filepath.Join(s.DataDir, "server.log"))
	return string(b)
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it.
// Its sandboxes keep running.
func (s *Server) Kill() {
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.logs.Close()
}

// Stop stops the server with SIGTERM, as an operator would, and waits for
// it. Its sandboxes keep running.
func (s *Server) Stop() {
	s.t.Helper()
	if !s.terminate(30 * time.Second) {
		s.t.Errorf("server did not stop within 30s of SIGTERM")
	}
	s.logs.Close()
}

// terminate sends SIGTERM and waits for the server, killing it after
// timeout; it reports whether the server stopped by itself.
func (s *Server) terminate(timeout time.Duration) bool {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		return true
	case <-time.After(timeout):
		s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.done
		return false
	}
}

// Restart starts the server again on the same data dir (after Kill or Stop).
func (s *Server) Restart() {
	s.t.Helper()
	if i := indexOf(s.args, "--listen"); i >= 0 {
		s.args[i+1] = strings.TrimPrefix(s.URL, "http://") // keep the port
	}
	s.start()
}

func indexOf(list []string, v string) int {
	for i, x := range list {
		if x == v {
			return i
		}
	}
	return -1
}

// cleanup destroys every sandbox of every tenant and stops the server, then
// removes what a crashed server may have left: containers, mounts, the
// data dir.
func (s *Server) cleanup() {
	select {
	case <-s.done:
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		s.destroyAll(ctx)
		s.terminate(10 * time.Second)
	}
	s.logs.Close()
	runcRoot := filepath.Join(s.DataDir, "edge", "container", "runc")
	if out, err := exec.Command("runc", "--root", runcRoot, "list", "-q").Output(); err == nil {
		for _, id := range strings.Fields(string(out)) {
			exec.Command("runc", "--root", runcRoot, "delete", "--force", id).Run()
		}
	}
	killVMs(filepath.Join(s.DataDir, "edge", "microvm", "vms"))
	UnmountAll(s.DataDir)
	StopBlobfs(filepath.Join(s.DataDir, "edge", "blobfs"))
	if i := indexOf(s.args, "--net-bridge"); i >= 0 {
		RemoveNodeNetwork(s.args[i+1])
	}
	RemoveCgroupLocks(s.DataDir)
	for _, cg := range s.cgroupDirs() {
		entries, _ := os.ReadDir(cg)
		for _, e := range entries {
			syscall.Rmdir(filepath.Join(cg, e.Name()))
		}
		syscall.Rmdir(cg)
	}
	if s.t.Failed() && os.Getenv("DSEC_KEEP_TEST_DATA") != "" {
		s.t.Logf("keeping %s", s.DataDir)
		return
	}
	os.RemoveAll(s.DataDir)
}

// RemoveCgroupLocks removes the cgroup parents' lock files (see the
// container backend's LockPath) that a killed backend whose data lies
// under dataDir left in /run/dsec, unless a live process holds them.
func RemoveCgroupLocks(dataDir string) {
	paths, _ := filepath.Glob("/run/dsec/cgroup-*.lock")
	for _, p := range paths {
		// A holder writes "pid N, data DIR".
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "data "+filepath.Clean(dataDir)+"/") {
			continue
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			os.Remove(p)
		}
		f.Close()
	}
}

// destroyAll deletes the sandboxes of every tenant through the API. Keys of
// other tenants are unknown here, so it mints an admin key per tenant.
func (s *Server) destroyAll(ctx context.Context) {
	tenants, err := s.Client.ListTenants(ctx)
	if err != nil {
		return
	}
	for _, tn := range tenants {
		c := s.Client
		if tn.ID != "t-admin" {
			k, err := s.Client.CreateKey(ctx, tn.ID, false)
			if err != nil {
				continue
			}
			c = client.New(s.URL, k.Secret)
		}
		for {
			page, err := c.ListSandboxes(ctx, client.ListOptions{Limit: 1000})
			if err != nil || len(page.Sandboxes) == 0 {
				break
			}
			for _, sb := range page.Sandboxes {
				c.DeleteSandbox(ctx, sb.ID)
			}
		}
	}
}

// StopBlobfs kills the blobfs process serving dir (the edge starts it in
// a session of its own, so it outlives the server) and waits until it is
// gone.
func StopBlobfs(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "blobfs.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return
	}
	// Only if it is still a dsec blobfs: the pid may have been reused.
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if !strings.Contains(string(cmdline), "blobfs") {
		return
	}
	syscall.Unmount(filepath.Join(dir, "mnt"), syscall.MNT_DETACH)
	syscall.Kill(pid, syscall.SIGKILL)
	Poll(5*time.Second, boolCond(func() bool { return syscall.Kill(pid, 0) != nil }))
}

// UnmountAll unmounts everything mounted under dir, deepest first.
func UnmountAll(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mps []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mps = append(mps, f[4])
		}
	}
	for i := len(mps) - 1; i >= 0; i-- {
		syscall.Unmount(mps[i], syscall.MNT_DETACH)
	}
}
