package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend/container"
	"github.com/dsec-project/dsec/internal/policy"
	"github.com/dsec-project/dsec/internal/sandboxnet"
)

// netFlags configure the node's sandbox network (modes allowlist, open).
type netFlags struct {
	bridge, subnet, uplinks, dns, deny string
}

func (n *netFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&n.subnet, "net-subnet", "", "IPv4 subnet of the sandboxes' bridge, e.g. 10.200.0.0/16 (empty: network modes allowlist and open are off)")
	fs.StringVar(&n.bridge, "net-bridge", "dsec0", "name of the sandboxes' bridge (at most 10 characters; also names the nftables table dsec_<bridge>)")
	fs.StringVar(&n.uplinks, "net-uplinks", "", "comma-separated interfaces sandbox traffic leaves by (default: that of the default route)")
	fs.StringVar(&n.dns, "net-dns", "", "comma-separated resolvers for sandboxes (default: the host's non-loopback ones)")
	fs.StringVar(&n.deny, "net-deny", "", "comma-separated IPv4 prefixes no sandbox may reach, on top of the node's own addresses (e.g. the control plane's)")
}

func (n *netFlags) config() (*container.NetworkConfig, error) {
	if n.subnet == "" {
		return nil, nil
	}
	subnet, err := netip.ParsePrefix(n.subnet)
	if err != nil {
		return nil, fmt.Errorf("--net-subnet: %w", err)
	}
	cfg := &container.NetworkConfig{Config: sandboxnet.Config{Bridge: n.bridge, Subnet: subnet, Uplinks: split(n.uplinks)}}
	for _, s := range split(n.dns) {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("--net-dns %q: want IPv4 addresses", s)
		}
		cfg.DNS = append(cfg.DNS, a)
	}
	if n.dns == "" {
		cfg.DNS = sandboxnet.HostResolvers()
	}
	for _, s := range split(n.deny) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("--net-deny %q: %w", s, err)
			}
			p = netip.PrefixFrom(a, 32)
		}
		cfg.Deny = append(cfg.Deny, p)
	}
	return cfg, nil
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// loadProfiles reads named policy profiles from a JSON file ("" is none).
func loadProfiles(path string) (map[string]api.Profile, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--profiles: %w", err)
	}
	var profiles map[string]api.Profile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&profiles); err != nil {
		return nil, fmt.Errorf("--profiles %s: %w", path, err)
	}
	for name, p := range profiles {
		if err := policy.CheckPhases(p.Phases, p.Phase); err != nil {
			return nil, fmt.Errorf("--profiles %s: profile %s: %w", path, name, err)
		}
		if len(p.Phases) == 0 {
			return nil, fmt.Errorf("--profiles %s: profile %s has no phases", path, name)
		}
	}
	return profiles, nil
}
