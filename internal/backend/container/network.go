package container

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/egress"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/policy"
	"github.com/dsec-project/dsec/internal/sandboxnet"
)

// NetworkConfig turns on network modes allowlist and open on this node.
type NetworkConfig struct {
	sandboxnet.Config
	// Deny are destinations no sandbox ever reaches, on top of the node's
	// own addresses, the sandboxes' subnet and link-local addresses: the
	// control plane and other nodes, say.
	Deny []netip.Prefix
}

// netState is the node's sandbox network: nil fields without one.
type netState struct {
	net      *sandboxnet.Net
	egress   *egress.Enforcer
	resolver policy.Resolver
}

func (b *Backend) setupNetwork(ctx context.Context, cfg *NetworkConfig) error {
	n, err := sandboxnet.Setup(ctx, cfg.Config)
	if err != nil {
		return err
	}
	e, err := egress.New(filepath.Join(b.cfg.Root, "bpf"))
	if err != nil {
		return err
	}
	deny := append([]netip.Prefix{
		n.Subnet(),
		netip.MustParsePrefix("169.254.0.0/16"), // link-local: cloud metadata services
		netip.MustParsePrefix("224.0.0.0/3"),    // multicast and reserved
	}, cfg.Deny...)
	deny = append(deny, nodeAddrs()...)
	if err := e.SetDeny(deny); err != nil {
		e.Close()
		return err
	}
	b.nets = netState{net: n, egress: e, resolver: policy.NewResolver(n.DNS())}
	return nil
}

// nodeAddrs are the node's own IPv4 addresses, loopback excepted (a
// sandbox's loopback is its own).
func nodeAddrs() []netip.Prefix {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if ok && !ip.IsLoopback() {
			out = append(out, netip.PrefixFrom(ip, 32))
		}
	}
	return out
}

// networkSpec checks a spec's network needs against the node and reserves
// an address.
func (b *Backend) reserveNetwork(rec *record) error {
	if !rec.Spec.NeedsNetwork {
		return nil
	}
	if b.nets.net == nil {
		return errdefs.Invalid("node has no sandbox network: network modes allowlist and open are off (start dsec with --net-subnet)")
	}
	if !rec.IP.IsValid() {
		ip, err := b.nets.net.Alloc(rec.Spec.ID)
		if err != nil {
			return fmt.Errorf("sandbox %s: %w: %w", rec.Spec.ID, err, errdefs.ErrResourceExhausted)
		}
		rec.IP = ip
	}
	return nil
}

// writeResolvConf writes the /etc/resolv.conf a networked sandbox gets.
func (b *Backend) writeResolvConf(rec *record) (string, error) {
	p := filepath.Join(b.dir(rec.Spec.ID), "resolv.conf")
	return p, os.WriteFile(p, b.nets.net.ResolvConf(), 0o644)
}

// connect puts a started container on the network: egress programs on its
// cgroup and its rules first, then its interface.
func (b *Backend) connect(ctx context.Context, rec *record) error {
	if !rec.Spec.NeedsNetwork {
		return nil
	}
	st, err := b.runc.readState(rec.Spec.ID)
	if err != nil {
		return err
	}
	cg, ok := st.CgroupPaths[""]
	if !ok {
		return errdefs.Invalid("network modes need the cgroup v2 hierarchy (mounted at /sys/fs/cgroup or /sys/fs/cgroup/unified)")
	}
	if rec.CgroupID != 0 {
		b.nets.egress.Forget(rec.CgroupID) // the cgroup of the container a reset replaced
	}
	t0 := time.Now()
	if rec.CgroupID, err = b.nets.egress.Attach(cg); err != nil {
		return err
	}
	t1 := time.Now()
	if err := b.applyNetwork(ctx, rec, rec.Spec.Network); err != nil {
		return err
	}
	t2 := time.Now()
	rec.Starts++
	if err := b.nets.net.Attach(sandboxnet.VethName(rec.Spec.ID, rec.Starts), st.InitPid, rec.IP); err != nil {
		return err
	}
	b.log.DebugContext(ctx, "connected", "sandbox", rec.Spec.ID, "attach", t1.Sub(t0), "rules", t2.Sub(t1), "veth", time.Since(t2))
	return nil
}

// applyNetwork replaces the sandbox's egress rules by those of n.
func (b *Backend) applyNetwork(ctx context.Context, rec *record, n api.Network) error {
	rules, err := policy.Rules(ctx, n, b.nets.net.DNS(), rec.IP, b.nets.resolver)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalid)
	}
	return b.nets.egress.SetRules(rec.CgroupID, rules)
}

// disconnect releases what connect and reserveNetwork took.
func (b *Backend) disconnect(rec *record) {
	if b.nets.net == nil || rec == nil {
		return
	}
	if rec.CgroupID != 0 {
		b.nets.egress.Forget(rec.CgroupID)
	}
	// The veth pair goes with the container's network namespace.
	if rec.IP.IsValid() {
		b.nets.net.Free(rec.Spec.ID, rec.IP)
	}
}

// pushFiles hands the agent the file rules of the current phase.
func (b *Backend) pushFiles(ctx context.Context, rec *record) error {
	if rec.Spec.Files.Deny == nil && rec.Spec.Files.ReadOnly == nil {
		return nil
	}
	return b.setAgentPolicy(ctx, rec.Spec.ID, rec.Spec.Phase, rec.Spec.Files)
}

func (b *Backend) setAgentPolicy(ctx context.Context, id, phase string, f api.FileRules) error {
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
	defer c.Close()
	err := c.SetPolicy(ctx, &agent.Policy{Phase: phase, Files: agent.FileRules{Deny: f.Deny, ReadOnly: f.ReadOnly}})
	if err != nil {
		return fmt.Errorf("sandbox %s: file rules: %w", id, err)
	}
	return nil
}

// SetPhase implements backend.Phaser: the agent gets the new file rules and
// the egress map the new network rules, each replaced in one step.
func (b *Backend) SetPhase(ctx context.Context, id string, p backend.Policy) error {
	rec, err := b.get(id)
	if err != nil {
		return err
	}
	if err := policy.CheckNetwork(&p.Network); err != nil {
		return err
	}
	if p.Network.Mode != api.NetworkNone && !rec.Spec.NeedsNetwork {
		return errdefs.Invalid("sandbox %s was created without a network interface: no phase of it may use network mode %s", id, p.Network.Mode)
	}
	if err := b.setAgentPolicy(ctx, id, p.Phase, p.Files); err != nil {
		return err
	}
	if rec.Spec.NeedsNetwork {
		if err := b.applyNetwork(ctx, rec, p.Network); err != nil {
			return fmt.Errorf("sandbox %s: network rules: %w", id, err)
		}
	}
	b.mu.Lock()
	rec.Spec.Phase, rec.Spec.Network, rec.Spec.Files = p.Phase, p.Network, p.Files
	b.mu.Unlock()
	return backend.WriteJSONFile(filepath.Join(b.dir(id), "sandbox.json"), rec)
}
