package testutil

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// VersityGW is the S3 server the tests run: versitygw with its posix
// backend, installed by `make tools` into bin/ (or found on PATH).
const versityGW = "versitygw"

// S3 is a running S3 server with one empty bucket.
type S3 struct {
	Endpoint  string // http://127.0.0.1:PORT
	Bucket    string
	AccessKey string
	SecretKey string
}

// URL is the store location dsec takes for it (see blob/s3.ParseURL).
func (s S3) URL() string {
	return fmt.Sprintf("s3://%s:%s@%s/%s", s.AccessKey, s.SecretKey, s.Endpoint[len("http://"):], s.Bucket)
}

// VersityGWBinary finds versitygw: bin/ of the repository, then PATH.
func VersityGWBinary() (string, error) {
	p := filepath.Join(RepoRoot(), "bin", versityGW)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return exec.LookPath(versityGW)
}

// HasVersityGW requires the versitygw binary.
func HasVersityGW() string {
	if _, err := VersityGWBinary(); err != nil {
		return "needs versitygw (make tools)"
	}
	return ""
}

// StartS3 starts a versitygw on a free loopback port over a fresh
// directory, with one bucket, and stops it when the test ends.
func StartS3(t testing.TB) S3 {
	t.Helper()
	Require(t, HasVersityGW)
	bin, _ := VersityGWBinary()
	root := t.TempDir()
	s := S3{Bucket: "dsec-test", AccessKey: "dsectest", SecretKey: "dsectestsecret"}
	// In the posix backend a bucket is a top-level directory.
	if err := os.Mkdir(filepath.Join(root, s.Bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		s.Endpoint = fmt.Sprintf("http://127.0.0.1:%d", port)
		cmd := exec.Command(bin, "--access", s.AccessKey, "--secret", s.SecretKey,
			"--port", fmt.Sprintf("127.0.0.1:%d", port), "posix", root)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		logf, err := os.Create(filepath.Join(t.TempDir(), "versitygw.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		started, done := make(chan error, 1), make(chan struct{})
		go func() {
			// The parent-death signal follows the thread that started the
			// child, not the process: that thread must live until the
			// child is reaped. (An unlocked one may be the next that a
			// goroutine locks and lets die, e.g. idmap's mount helper,
			// which killed the server mid-test.)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			err := cmd.Start()
			started <- err
			if err == nil {
				cmd.Wait()
			}
			close(done)
		}()
		if err := <-started; err != nil {
			t.Fatal(err)
		}
		if waitHTTP(s.Endpoint, done, 15*time.Second) {
			t.Cleanup(func() {
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-done
				logf.Close()
			})
			return s
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		logs, _ := os.ReadFile(logf.Name())
		logf.Close()
		if attempt == 2 {
			t.Fatalf("versitygw did not start:\n%s", logs)
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitHTTP waits until url answers anything, the process exits, or the
// timeout passes.
func waitHTTP(url string, exited <-chan struct{}, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			return true
		}
		select {
		case <-exited:
			return false
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}
