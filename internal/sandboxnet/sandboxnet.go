// Package sandboxnet connects sandboxes that may use the network to the
// outside: one bridge per node with the sandboxes' gateway address, one
// veth pair per sandbox (its end named eth0 inside, the bridge port
// isolated so that sandboxes never exchange frames), source NAT towards
// the uplinks, and an nftables table of the node's own that drops
// whatever a sandbox sends to the node itself or to another sandbox and
// anything sent to a sandbox that it did not ask for. Which destinations
// a sandbox reaches beyond that is decided per sandbox by package egress.
//
// Everything global it makes is named from Config.Bridge (the bridge, the
// nftables table "dsec_<bridge>", veths derived from sandbox ids), so that
// several nodes, or tests, share a machine. It must never touch an
// interface, route or table it did not make, except the forwarding switch
// of the uplinks it is given.
package sandboxnet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Config is a node's sandbox network.
type Config struct {
	// Bridge is the bridge's name (at most 10 bytes: it also names the
	// nftables table).
	Bridge string
	// Subnet holds the bridge's address (the first) and the sandboxes'.
	Subnet netip.Prefix
	// Uplinks are the interfaces sandbox traffic leaves by: forwarding
	// is switched on for them. Empty: the interface of the default route.
	Uplinks []string
	// DNS are the resolvers sandboxes are given (in /etc/resolv.conf).
	DNS []netip.Addr
}

// Net is a node's sandbox network, set up.
type Net struct {
	cfg     Config
	gateway netip.Addr
	bridge  netlink.Link

	mu   sync.Mutex
	used map[netip.Addr]string // address → sandbox
}

// Setup creates (or adopts) the bridge and the nftables table.
func Setup(ctx context.Context, cfg Config) (*Net, error) {
	if cfg.Bridge == "" || len(cfg.Bridge) > 10 || strings.ContainsAny(cfg.Bridge, " /\"") {
		return nil, fmt.Errorf("sandbox network: bridge name %q: want 1 to 10 plain characters", cfg.Bridge)
	}
	if !cfg.Subnet.IsValid() || !cfg.Subnet.Addr().Is4() || cfg.Subnet.Bits() > 29 {
		return nil, fmt.Errorf("sandbox network: subnet %s: want an IPv4 prefix of /29 or wider", cfg.Subnet)
	}
	cfg.Subnet = cfg.Subnet.Masked()
	n := &Net{cfg: cfg, gateway: cfg.Subnet.Addr().Next(), used: map[netip.Addr]string{}}
	if err := n.setupBridge(); err != nil {
		return nil, fmt.Errorf("sandbox network: %w", err)
	}
	uplinks := cfg.Uplinks
	if len(uplinks) == 0 {
		up, err := defaultRouteLink()
		if err != nil {
			return nil, fmt.Errorf("sandbox network: %w", err)
		}
		uplinks = []string{up}
	}
	for _, ifc := range append([]string{cfg.Bridge}, uplinks...) {
		if err := sysctl("net/ipv4/conf/"+ifc+"/forwarding", "1"); err != nil {
			return nil, fmt.Errorf("sandbox network: %w", err)
		}
	}
	if err := n.setupNftables(ctx); err != nil {
		return nil, fmt.Errorf("sandbox network: %w", err)
	}
	return n, nil
}

// Gateway is the bridge's address: what sandboxes route through.
func (n *Net) Gateway() netip.Addr { return n.gateway }

// Subnet is the sandboxes' subnet.
func (n *Net) Subnet() netip.Prefix { return n.cfg.Subnet }

// DNS are the resolvers sandboxes use.
func (n *Net) DNS() []netip.Addr { return n.cfg.DNS }

func (n *Net) setupBridge() error {
	br, err := netlink.LinkByName(n.cfg.Bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("bridge %s: %w", n.cfg.Bridge, err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = n.cfg.Bridge
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create bridge %s: %w", n.cfg.Bridge, err)
		}
		if br, err = netlink.LinkByName(n.cfg.Bridge); err != nil {
			return fmt.Errorf("bridge %s: %w", n.cfg.Bridge, err)
		}
	}
	if _, ok := br.(*netlink.Bridge); !ok {
		return fmt.Errorf("%s exists and is not a bridge", n.cfg.Bridge)
	}
	// No IPv6 on the bridge: sandboxes have none either.
	sysctl("net/ipv6/conf/"+n.cfg.Bridge+"/disable_ipv6", "1")
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.gateway.AsSlice(), Mask: net.CIDRMask(n.cfg.Subnet.Bits(), 32)}}
	if err := netlink.AddrReplace(br, addr); err != nil {
		return fmt.Errorf("address of bridge %s: %w", n.cfg.Bridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("bridge %s up: %w", n.cfg.Bridge, err)
	}
	n.bridge = br
	return nil
}

// table is the nftables table of this node's sandboxes.
func (n *Net) table() string { return "dsec_" + n.cfg.Bridge }

// setupNftables (re)writes the node's table in one transaction.
func (n *Net) setupNftables(ctx context.Context) error {
	br, subnet := n.cfg.Bridge, n.cfg.Subnet.String()
	ruleset := fmt.Sprintf(`table ip %[1]s
delete table ip %[1]s
table ip %[1]s {
	chain input {
		type filter hook input priority filter - 10; policy accept;
		iifname "%[2]s" drop
	}
	chain forward {
		type filter hook forward priority filter - 10; policy accept;
		iifname "%[2]s" oifname "%[2]s" drop
		iifname "%[2]s" ip daddr { 169.254.0.0/16, 224.0.0.0/4, 255.255.255.255 } drop
		oifname "%[2]s" ct state established,related accept
		oifname "%[2]s" drop
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr %[3]s oifname != "%[2]s" masquerade
	}
}
`, n.table(), br, subnet)
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft table %s: %w: %s", n.table(), err, out)
	}
	return nil
}

// Remove deletes the bridge and the table. Sandboxes attached lose their
// network; it is for tests and for taking a node out of service.
func (n *Net) Remove(ctx context.Context) error {
	var errs []error
	if out, err := exec.CommandContext(ctx, "nft", "delete", "table", "ip", n.table()).CombinedOutput(); err != nil &&
		!strings.Contains(string(out), "No such file") {
		errs = append(errs, fmt.Errorf("delete table %s: %w: %s", n.table(), err, out))
	}
	if br, err := netlink.LinkByName(n.cfg.Bridge); err == nil {
		if err := netlink.LinkDel(br); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w", n.cfg.Bridge, err))
		}
	}
	return errors.Join(errs...)
}

// Alloc reserves an address for sandbox id; Free returns it. Reserve marks
// an address as taken after a restart.
func (n *Net) Alloc(id string) (netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for a := n.gateway.Next(); n.cfg.Subnet.Contains(a); a = a.Next() {
		if !n.cfg.Subnet.Contains(a.Next()) {
			break // the broadcast address
		}
		if _, taken := n.used[a]; !taken {
			n.used[a] = id
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no free address in %s", n.cfg.Subnet)
}

// Reserve marks addr as sandbox id's.
func (n *Net) Reserve(id string, addr netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.used[addr] = id
}

// Free returns sandbox id's address.
func (n *Net) Free(id string, addr netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.used[addr] == id {
		delete(n.used, addr)
	}
}

// VethName is the host end of the veth pair of the start-th container of
// sandbox id: a reset's new container never waits for its predecessor's
// pair to go.
func VethName(id string, start int) string {
	h := sha256.Sum256([]byte(id + "/" + strconv.Itoa(start)))
	return "dv" + hex.EncodeToString(h[:6])
}

// Attach gives the network namespace of process pid an eth0 with addr,
// plugged into the bridge through the host end host, and a default route
// through the gateway. The pair goes away with the namespace: deleting it
// by hand would wait for the network stack's RCU grace periods.
func (n *Net) Attach(host string, pid int, addr netip.Addr) error {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return fmt.Errorf("veth %s: netns: %w", host, err)
	}
	defer ns.Close()
	la := netlink.NewLinkAttrs()
	la.Name = host
	la.MasterIndex = n.bridge.Attrs().Index
	veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s: %w", host, err)
	}
	link, err := netlink.LinkByName(host)
	if err == nil {
		err = netlink.LinkSetIsolated(link, true)
	}
	if err == nil {
		err = netlink.LinkSetUp(link)
	}
	if err != nil {
		n.Detach(host)
		return fmt.Errorf("veth %s: host end: %w", host, err)
	}
	if err := n.configureInside(ns, addr); err != nil {
		n.Detach(host)
		return fmt.Errorf("veth %s: %w", host, err)
	}
	return nil
}

func (n *Net) configureInside(ns netns.NsHandle, addr netip.Addr) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	ipn := &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(n.cfg.Subnet.Bits(), 32)}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipn}); err != nil {
		return fmt.Errorf("address: %w", err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		h.LinkSetUp(lo)
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: n.gateway.AsSlice()}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// Detach removes the veth pair whose host end is host, if any.
func (n *Net) Detach(host string) {
	if link, err := netlink.LinkByName(host); err == nil {
		netlink.LinkDel(link)
	}
}

// ResolvConf is the /etc/resolv.conf of a sandbox with network.
func (n *Net) ResolvConf() []byte {
	var b strings.Builder
	for _, a := range n.cfg.DNS {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	b.WriteString("options timeout:2 attempts:2\n")
	return []byte(b.String())
}

func defaultRouteLink() (string, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return "", fmt.Errorf("routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() && r.Dst.Mask != nil && isZeroMask(r.Dst.Mask) {
			l, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil {
				return "", err
			}
			return l.Attrs().Name, nil
		}
	}
	return "", errors.New("no default route: name the uplinks")
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

func sysctl(name, value string) error {
	if err := os.WriteFile("/proc/sys/"+name, []byte(value), 0); err != nil {
		return fmt.Errorf("sysctl %s: %w", name, err)
	}
	return nil
}

// HostResolvers are the non-loopback name servers of the host's
// /etc/resolv.conf: the default for sandboxes.
func HostResolvers() []netip.Addr {
	b, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() && !a.IsLoopback() {
				out = append(out, a)
			}
		}
	}
	return out
}
