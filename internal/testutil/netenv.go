package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Outside is a stand-in for the world beyond a node, made for one test: a
// network namespace of its own, joined to the host by a veth, with web
// servers on two addresses. Test traffic never leaves the machine.
type Outside struct {
	NS     string // network namespace name
	Uplink string // host end of its veth: the node's uplink in the test
	// Host is the host end's address (what the node masquerades to);
	// Web and Other are addresses inside, each serving HTTP on ports 8080
	// and 8081 a file /hello holding "hello from <addr>:<port>".
	Host, Web, Other string
	// Bridge and Subnet are unique names for the node's sandbox network.
	Bridge, Subnet string
}

// NewOutside builds an Outside and removes it at the end of the test.
func NewOutside(t testing.TB) *Outside {
	t.Helper()
	Require(t, Root, Tool("ip"), Tool("nft"), File("/bin/busybox"))
	var b [2]byte
	rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	x := int(b[0])
	o := &Outside{
		NS: "dsec-out-" + suffix, Uplink: "dso" + suffix,
		Host: fmt.Sprintf("198.19.%d.1", x), Web: fmt.Sprintf("198.19.%d.2", x), Other: fmt.Sprintf("198.19.%d.3", x),
		Bridge: "dsb" + suffix, Subnet: fmt.Sprintf("198.18.%d.0/24", x),
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "netns", "add", o.NS)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", o.NS).Run() })
	run("ip", "link", "add", o.Uplink, "type", "veth", "peer", "name", "eth0", "netns", o.NS)
	t.Cleanup(func() { exec.Command("ip", "link", "del", o.Uplink).Run() })
	run("ip", "addr", "add", o.Host+"/24", "dev", o.Uplink)
	run("ip", "link", "set", o.Uplink, "up")
	in := func(args ...string) { run(append([]string{"ip", "netns", "exec", o.NS}, args...)...) }
	in("ip", "addr", "add", o.Web+"/24", "dev", "eth0")
	in("ip", "addr", "add", o.Other+"/24", "dev", "eth0")
	in("ip", "link", "set", "eth0", "up")
	in("ip", "link", "set", "lo", "up")
	for _, addr := range []string{o.Web, o.Other} {
		for _, port := range []string{"8080", "8081"} {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "hello"), []byte("hello from "+addr+":"+port+"\n"), 0o644)
			cmd := exec.Command("ip", "netns", "exec", o.NS, "/bin/busybox", "httpd", "-f", "-p", addr+":"+port, "-h", dir)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		}
	}
	// Wait until the servers listen.
	EventuallyTrue(t, 5*time.Second, "outside web servers listening", func() bool {
		out, _ := exec.Command("ip", "netns", "exec", o.NS, "/bin/busybox", "wget", "-q", "-O", "-", "http://"+o.Other+":8081/hello").Output()
		return strings.Contains(string(out), "hello")
	})
	return o
}

// ServerFlags are the dsec server flags of a node whose sandboxes reach
// this Outside.
func (o *Outside) ServerFlags() []string {
	return []string{"--net-subnet", o.Subnet, "--net-bridge", o.Bridge, "--net-uplinks", o.Uplink, "--net-dns", o.Web}
}

// RemoveNodeNetwork deletes a node's bridge and nftables table.
func RemoveNodeNetwork(bridge string) {
	exec.Command("nft", "delete", "table", "ip", "dsec_"+bridge).Run()
	exec.Command("ip", "link", "del", bridge).Run()
}
