// Package policy checks sandbox policies — network modes, allowlists,
// file rules and named phases — and turns a sandbox's network policy into
// the prefix rules package egress enforces. The control plane uses it to
// refuse bad requests; the node uses it to compile what it enforces. It
// must never enforce anything itself.
package policy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/egress"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Limits of a policy.
const (
	MaxAllow  = 256
	MaxPhases = 16
	maxPaths  = 256
)

var (
	phaseRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
	hostRE  = regexp.MustCompile(`^([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.)*[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.?$`)
)

// Dest is one parsed allowlist entry: a prefix or a host name, and
// optionally one port.
type Dest struct {
	Prefix netip.Prefix // valid unless Host is set
	Host   string
	Port   uint16 // 0: every port
}

// ParseDest parses "1.2.3.4", "1.2.3.0/24", "1.2.3.4:443",
// "1.2.3.0/24:443", "example.com" or "example.com:443".
func ParseDest(s string) (Dest, error) {
	var d Dest
	host := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || p == 0 {
			return d, errdefs.Invalid("network.allow %q: bad port", s)
		}
		host, d.Port = s[:i], uint16(p)
	}
	if strings.ContainsRune(host, ':') || strings.HasPrefix(host, "[") {
		return d, errdefs.Invalid("network.allow %q: IPv6 destinations are not supported (sandboxes have IPv4 only)", s)
	}
	if pfx, err := netip.ParsePrefix(host); err == nil {
		if !pfx.Addr().Is4() {
			return d, errdefs.Invalid("network.allow %q: want an IPv4 prefix", s)
		}
		d.Prefix = pfx.Masked()
		return d, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		d.Prefix = netip.PrefixFrom(a, 32)
		return d, nil
	}
	if host == "" || len(host) > 253 || !hostRE.MatchString(host) {
		return d, errdefs.Invalid("network.allow %q: want an IPv4 address or prefix, or a host name, with an optional :port", s)
	}
	d.Host = strings.TrimSuffix(strings.ToLower(host), ".")
	return d, nil
}

// CheckNetwork validates a network policy and fills in the default mode.
func CheckNetwork(n *api.Network) error {
	switch n.Mode {
	case "":
		n.Mode = api.NetworkNone
	case api.NetworkNone, api.NetworkAllowlist, api.NetworkOpen:
	default:
		return errdefs.Invalid("unknown network mode %q (want none, allowlist or open)", n.Mode)
	}
	if len(n.Allow) > 0 && n.Mode != api.NetworkAllowlist {
		return errdefs.Invalid("network.allow needs mode allowlist")
	}
	if len(n.Allow) > MaxAllow {
		return errdefs.Invalid("network.allow: at most %d entries", MaxAllow)
	}
	for _, a := range n.Allow {
		if _, err := ParseDest(a); err != nil {
			return err
		}
	}
	return nil
}

// CheckFiles validates file rules.
func CheckFiles(f *api.FileRules) error {
	if len(f.Deny)+len(f.ReadOnly) > maxPaths {
		return errdefs.Invalid("files: at most %d paths", maxPaths)
	}
	for _, p := range slices.Concat(f.Deny, f.ReadOnly) {
		if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) || strings.Contains(p+"/", "/../") || len(p) > 4096 {
			return errdefs.Invalid("files: path %q: want an absolute path without '..'", p)
		}
		if strings.Trim(p, "/") == "" {
			return errdefs.Invalid("files: path %q: the root itself cannot be restricted", p)
		}
	}
	return nil
}

// CheckPhases validates named phases and the phase a sandbox starts in.
func CheckPhases(phases map[string]api.Phase, initial string) error {
	if len(phases) == 0 {
		if initial != "" {
			return errdefs.Invalid("phase %q: the sandbox defines no phases (set phases or profile)", initial)
		}
		return nil
	}
	if len(phases) > MaxPhases {
		return errdefs.Invalid("at most %d phases", MaxPhases)
	}
	for name, ph := range phases {
		if !phaseRE.MatchString(name) {
			return errdefs.Invalid("phase name %q: want [a-z][a-z0-9_-]{0,31}", name)
		}
		if ph.Network != nil {
			if err := CheckNetwork(ph.Network); err != nil {
				return fmt.Errorf("phase %s: %w", name, err)
			}
		}
		if ph.Files != nil {
			if err := CheckFiles(ph.Files); err != nil {
				return fmt.Errorf("phase %s: %w", name, err)
			}
		}
	}
	if initial == "" {
		return errdefs.Invalid("phase is required when phases are defined: name the phase the sandbox starts in")
	}
	if _, ok := phases[initial]; !ok {
		return errdefs.Invalid("phase %q is not one of the sandbox's phases", initial)
	}
	return nil
}

// Effective is what a sandbox enforces in a phase: the phase's network
// (or the sandbox's own) and file rules.
func Effective(top api.Network, phases map[string]api.Phase, phase string) (api.Network, api.FileRules) {
	n, f := top, api.FileRules{}
	if ph, ok := phases[phase]; ok {
		if ph.Network != nil {
			n = *ph.Network
		}
		if ph.Files != nil {
			f = *ph.Files
		}
	}
	return n, f
}

// NeedsNetwork reports whether any phase of the sandbox may reach beyond
// itself: only then does it get an interface.
func NeedsNetwork(top api.Network, phases map[string]api.Phase) bool {
	if top.Mode != "" && top.Mode != api.NetworkNone {
		return true
	}
	for _, ph := range phases {
		if ph.Network != nil && ph.Network.Mode != "" && ph.Network.Mode != api.NetworkNone {
			return true
		}
	}
	return false
}

// private are the ranges an open sandbox does not reach unless allowed by
// name: other machines of the operator's own networks.
var private = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("100.64.0.0/10"),
}

// Resolver finds the IPv4 addresses of a host name.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Rules compiles a network policy into egress rules. The resolvers in dns
// are reachable on port 53 in modes allowlist and open; self (the
// sandbox's own address) always is. Host names are resolved now.
func Rules(ctx context.Context, n api.Network, dns []netip.Addr, self netip.Addr, r Resolver) ([]egress.Rule, error) {
	var rules []egress.Rule
	if self.IsValid() {
		rules = append(rules, egress.Rule{Prefix: netip.PrefixFrom(self, 32), Allow: true})
	}
	if n.Mode == api.NetworkNone || n.Mode == "" {
		return rules, nil
	}
	for _, a := range dns {
		rules = append(rules, egress.Rule{Prefix: netip.PrefixFrom(a, 32), Allow: true, Ports: []uint16{53}})
	}
	if n.Mode == api.NetworkOpen {
		rules = append(rules, egress.Rule{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Allow: true})
		for _, p := range private {
			rules = append(rules, egress.Rule{Prefix: p, Allow: false})
		}
		return rules, nil
	}
	for _, entry := range n.Allow {
		d, err := ParseDest(entry)
		if err != nil {
			return nil, err
		}
		var ports []uint16
		if d.Port != 0 {
			ports = []uint16{d.Port}
		}
		if d.Host == "" {
			rules = append(rules, egress.Rule{Prefix: d.Prefix, Allow: true, Ports: ports})
			continue
		}
		addrs, err := r.LookupNetIP(ctx, "ip4", d.Host)
		if err != nil {
			return nil, fmt.Errorf("network.allow %q: resolve: %w", entry, err)
		}
		for _, a := range addrs {
			rules = append(rules, egress.Rule{Prefix: netip.PrefixFrom(a.Unmap(), 32), Allow: true, Ports: ports})
		}
	}
	return rules, nil
}

// NewResolver resolves through the given name servers (the sandboxes'
// own), or the host's if there are none.
func NewResolver(servers []netip.Addr) Resolver {
	if len(servers) == 0 {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		var err error
		for _, s := range servers {
			var c net.Conn
			if c, err = d.DialContext(ctx, network, netip.AddrPortFrom(s, 53).String()); err == nil {
				return c, nil
			}
		}
		return nil, err
	}}
}
