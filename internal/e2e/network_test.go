package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// fetch gets http://host:port/hello from inside the sandbox (with nc:
// static busybox's wget needs NSS libraries a minimal base lacks) and
// reports whether the page came.
func fetch(t *testing.T, c *client.Client, id, hostPort string) (bool, string) {
	t.Helper()
	host, port, _ := strings.Cut(hostPort, ":")
	res, err := c.Exec(ctxT(t), id, &api.ExecRequest{
		Shell: fmt.Sprintf(`printf 'GET /hello HTTP/1.0\r\n\r\n' | nc -w 3 %s %s`, host, port), TimeoutMs: 10000,
	})
	if err != nil {
		t.Fatalf("exec nc %s: %v", hostPort, err)
	}
	return strings.Contains(res.Stdout, "hello from"), res.Stdout + res.Stderr
}

func netSandbox(t *testing.T, c *client.Client, req api.CreateSandboxRequest) *api.Sandbox {
	t.Helper()
	req.Layers = &api.LayerRefs{Base: "base:minimal"}
	req.Resources = api.Resources{MemoryMB: 128}
	sb, err := c.CreateSandbox(ctxT(t), &req)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	return sb
}

// TestNetworkModes: none reaches nothing, allowlist exactly what it lists,
// open everything outside the node; no mode reaches the node itself,
// link-local metadata addresses or another sandbox.
func TestNetworkModes(t *testing.T) {
	out := testutil.NewOutside(t)
	s := startServer(t, out.ServerFlags()...)
	c := s.Client
	web8080, web8081 := out.Web+":8080", out.Web+":8081"
	other := out.Other + ":8080"

	shBefore, _ := os.ReadFile("/bin/sh")
	nb := newNeighbour(t, c)
	none := netSandbox(t, c, api.CreateSandboxRequest{})
	allow := netSandbox(t, c, api.CreateSandboxRequest{Network: &api.Network{
		Mode: api.NetworkAllowlist, Allow: []string{out.Web + ":8080"},
	}})
	open := netSandbox(t, c, api.CreateSandboxRequest{Network: &api.Network{Mode: api.NetworkOpen}})
	gateway := netip.MustParsePrefix(out.Subnet).Addr().Next().String()
	openIP := strings.TrimSpace(sh(t, c, open.ID, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1"))

	for _, tc := range []struct {
		name string
		sb   *api.Sandbox
		url  string
		ok   bool
	}{
		{"none cannot reach the outside", none, web8080, false},
		{"allowlist reaches its destination", allow, web8080, true},
		{"allowlist: another port is refused", allow, web8081, false},
		{"allowlist: another host is refused", allow, other, false},
		{"open reaches the outside", open, web8080, true},
		{"open reaches any port", open, web8081, true},
		{"open reaches any outside host", open, other, true},
		{"open cannot reach the bridge gateway (the node)", open, gateway + ":7070", false},
		{"open cannot reach the node's uplink address", open, out.Host + ":7070", false},
		{"open cannot reach link-local metadata", open, "169.254.169.254:80", false},
		{"allowlist cannot reach another sandbox", allow, openIP + ":8080", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if ok, msg := fetch(t, c, tc.sb.ID, tc.url); ok != tc.ok {
				t.Fatalf("fetch %s: got through %v, want %v (%s)", tc.url, ok, tc.ok, msg)
			}
		})
	}

	t.Run("none has loopback only", func(t *testing.T) {
		if got := sh(t, c, none.ID, "ls /sys/class/net | tr '\\n' ' '"); got != "lo " {
			t.Fatalf("interfaces of a none sandbox: %q", got)
		}
	})

	t.Run("port scan of the node finds nothing open", func(t *testing.T) {
		// The node's services (edge, control plane, agents) are all on the
		// node's addresses: none answers a sandbox.
		script := fmt.Sprintf(`n=0; for h in %s %s; do for p in 22 53 80 443 7070 7071 8080 9090; do
			if nc -w 1 $h $p </dev/null 2>/dev/null; then echo open $h:$p; fi; done; done; echo done`, gateway, out.Host)
		if got := sh(t, c, open.ID, script); got != "done\n" {
			t.Fatalf("scan found: %q", got)
		}
	})

	t.Run("raw sockets are refused", func(t *testing.T) {
		res, err := c.Exec(ctxT(t), open.ID, &api.ExecRequest{Shell: "ping -c 1 -W 1 " + out.Web})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 {
			t.Fatalf("ping (a raw socket) worked: %s", res.Stdout)
		}
	})

	t.Run("the neighbour and the host are unaffected, the scanner resets", func(t *testing.T) {
		nb.check(t)
		hostOK(t, s, shBefore)
		recovers(t, c, open.ID)
	})

	t.Run("reset keeps the network", func(t *testing.T) {
		if _, err := c.Reset(ctxT(t), allow.ID); err != nil {
			t.Fatal(err)
		}
		if ok, msg := fetch(t, c, allow.ID, web8080); !ok {
			t.Fatalf("after reset: %s", msg)
		}
		if ok, _ := fetch(t, c, allow.ID, other); ok {
			t.Fatal("after reset the allowlist no longer holds")
		}
	})
}

// TestNetworkAfterRestart: a killed and restarted server finds its egress
// maps again; rules hold, phase switches and resets still work, and a new
// networked sandbox gets a fresh address.
func TestNetworkAfterRestart(t *testing.T) {
	out := testutil.NewOutside(t)
	s := startServer(t, out.ServerFlags()...)
	c := s.Client
	sb := netSandbox(t, c, api.CreateSandboxRequest{
		Phase: "work",
		Phases: map[string]api.Phase{
			"work": {Network: &api.Network{Mode: api.NetworkAllowlist, Allow: []string{out.Web + ":8080"}}},
			"open": {Network: &api.Network{Mode: api.NetworkOpen}},
		},
	})
	s.Kill()
	s.Restart()
	c = s.Client
	if ok, msg := fetch(t, c, sb.ID, out.Web+":8080"); !ok {
		t.Fatalf("allowlisted after restart: %s", msg)
	}
	if ok, _ := fetch(t, c, sb.ID, out.Other+":8080"); ok {
		t.Fatal("the allowlist no longer holds after a restart")
	}
	if _, err := c.SetPhase(ctxT(t), sb.ID, "open"); err != nil {
		t.Fatal(err)
	}
	if ok, msg := fetch(t, c, sb.ID, out.Other+":8080"); !ok {
		t.Fatalf("phase open after restart: %s", msg)
	}
	if _, err := c.Reset(ctxT(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	if ok, msg := fetch(t, c, sb.ID, out.Other+":8080"); !ok {
		t.Fatalf("after restart and reset: %s", msg)
	}
	other := netSandbox(t, c, api.CreateSandboxRequest{Network: &api.Network{Mode: api.NetworkOpen}})
	a := sh(t, c, sb.ID, "ip -4 -o addr show eth0 | awk '{print $4}'")
	b := sh(t, c, other.ID, "ip -4 -o addr show eth0 | awk '{print $4}'")
	if a == b {
		t.Fatalf("two sandboxes share address %s", a)
	}
}
