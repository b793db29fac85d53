package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/backend/container"
	"github.com/dsec-project/dsec/internal/testutil"
)

// lan is a bridge on the host with an address, standing for the network
// between the control plane's host and its nodes.
type lan struct {
	suffix string // unique to this test: names of links and netns
	prefix string // "10.a.b."
	bridge string
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newLAN makes a bridge with a /24 of 10.0.0.0/8 no interface of the host
// uses, and removes it when the test ends.
func newLAN(t *testing.T) *lan {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	l := &lan{suffix: hex.EncodeToString(b)}
	addrs, _ := exec.Command("ip", "-o", "-4", "addr").Output()
	for range 50 {
		x, _ := rand.Int(rand.Reader, big.NewInt(50))
		y, _ := rand.Int(rand.Reader, big.NewInt(250))
		p := fmt.Sprintf("10.%d.%d.", 200+x.Int64(), y.Int64()+1)
		if !strings.Contains(string(addrs), " "+p) {
			l.prefix = p
			break
		}
	}
	if l.prefix == "" {
		t.Fatal("no free 10.x.y.0/24 for the test network")
	}
	l.bridge = "d8b" + l.suffix
	run(t, "ip", "link", "add", l.bridge, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", l.bridge).Run() })
	run(t, "ip", "addr", "add", l.prefix+"1/24", "dev", l.bridge)
	run(t, "ip", "link", "set", l.bridge, "up")
	return l
}

// host is a network namespace plugged into the LAN, standing for one
// machine.
type host struct {
	netns string
	ip    string
}

func (l *lan) addHost(t *testing.T, i int) host {
	t.Helper()
	h := host{netns: fmt.Sprintf("d8n%s%d", l.suffix, i), ip: fmt.Sprintf("%s%d", l.prefix, 10+i)}
	veth, peer := fmt.Sprintf("d8v%s%d", l.suffix, i), fmt.Sprintf("d8p%s%d", l.suffix, i)
	run(t, "ip", "netns", "add", h.netns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", h.netns).Run() })
	run(t, "ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { exec.Command("ip", "link", "del", veth).Run() })
	run(t, "ip", "link", "set", peer, "netns", h.netns)
	run(t, "ip", "link", "set", veth, "master", l.bridge, "up")
	in := []string{"ip", "netns", "exec", h.netns}
	run(t, append(in, "ip", "addr", "add", h.ip+"/24", "dev", peer)...)
	run(t, append(in, "ip", "link", "set", peer, "up")...)
	run(t, append(in, "ip", "link", "set", "lo", "up")...)
	return h
}

// joinedEdge is a `dsec edge` running in a host's network namespace (and
// the host's mount namespace, so that its mounts can be cleaned up from
// here), with its own data dir, runc root, blobfs and cgroup parent,
// sharing the control plane's layer store (a directory: the shared POSIX
// mount case).
type joinedEdge struct {
	id, dir, cgroup string
	cmd             *exec.Cmd
	done            chan struct{}
}

func startJoinedEdge(t *testing.T, h host, id, joinURL, token, layers string) *joinedEdge {
	t.Helper()
	bin := testutil.Binaries(t)
	dir, err := os.MkdirTemp("", "dsec-test-edge-")
	if err != nil {
		t.Fatal(err)
	}
	e := &joinedEdge{id: id, dir: dir, cgroup: "dsec-test-" + filepath.Base(dir), done: make(chan struct{})}
	logf, err := os.Create(filepath.Join(dir, "edge.log"))
	if err != nil {
		t.Fatal(err)
	}
	e.cmd = exec.Command("nsenter", "--net=/run/netns/"+h.netns, "--",
		filepath.Join(bin, "dsec"), "edge", "--join", joinURL, "--token", token,
		"--listen", h.ip+":7071", "--data", filepath.Join(dir, "data"), "--store", layers,
		"--node-id", id, "--agent", filepath.Join(bin, "dsec-agent"), "--cgroup-parent", e.cgroup,
		"--cpu", "64", "--memory-mb", "6144", "--heartbeat", "300ms")
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { e.cmd.Wait(); logf.Close(); close(e.done) }()
	t.Cleanup(func() { e.cleanup(t) })
	return e
}

// kill kills the edge as a crash would (its containers keep running).
func (e *joinedEdge) kill() {
	e.cmd.Process.Signal(syscall.SIGKILL)
	<-e.done
}

func (e *joinedEdge) logs() string {
	b, _ := os.ReadFile(filepath.Join(e.dir, "edge.log"))
	return string(b)
}

// cleanup stops the edge and removes what it and its sandboxes left:
// containers (a killed edge's keep running), mounts, cgroups, the dir.
func (e *joinedEdge) cleanup(t *testing.T) {
	select {
	case <-e.done:
	default:
		e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.done:
		case <-time.After(10 * time.Second):
			e.kill()
		}
	}
	if t.Failed() {
		t.Logf("edge %s log:\n%s", e.id, e.logs())
	}
	runcRoot := filepath.Join(e.dir, "data", "container", "runc")
	if out, err := exec.Command("runc", "--root", runcRoot, "list", "-q").Output(); err == nil {
		for _, id := range strings.Fields(string(out)) {
			exec.Command("runc", "--root", runcRoot, "delete", "--force", id).Run()
		}
	}
	testutil.UnmountAll(e.dir)
	testutil.StopBlobfs(filepath.Join(e.dir, "data", "blobfs"))
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, r := range append(roots, "/sys/fs/cgroup") {
		cg := filepath.Join(r, e.cgroup)
		entries, _ := os.ReadDir(cg)
		for _, en := range entries {
			if en.IsDir() {
				syscall.Rmdir(filepath.Join(cg, en.Name()))
			}
		}
		syscall.Rmdir(cg)
	}
	os.Remove(container.LockPath(e.cgroup)) // a killed edge leaves it
	os.RemoveAll(e.dir)
}

// waitUntil polls cond every 100 ms for up to d.
func waitUntil(t *testing.T, d time.Duration, what string, cond func(ctx context.Context) bool) {
	t.Helper()
	testutil.EventuallyTrue(t, d, what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return cond(ctx)
	})
}
