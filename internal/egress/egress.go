// Package egress enforces where sandboxes may send network traffic, with
// eBPF programs on each sandbox's cgroup (cgroup v2): connect4/connect6
// and sendmsg4/sendmsg6 refuse a connection or datagram to a destination
// the sandbox may not reach (the caller sees EPERM at once), and an
// egress cgroup_skb program drops every other IP packet to such a
// destination (raw, ICMP, SCTP…). The programs read two maps: the node's
// deny list, which no sandbox rule overrides, and a map from cgroup id to
// the sandbox's own rules (an LPM trie of prefixes with a verdict and
// ports), replaced whole and atomically when the sandbox's policy changes.
//
// Programs are attached with BPF_F_ALLOW_MULTI and no link, so they stay
// attached when the edge exits and go with the cgroup; the maps are pinned
// in a bpffs of the backend's own, so a restarted edge finds them again.
// The package must never attach anything outside the cgroups it is given.
package egress

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// maxPorts is how many ports one destination prefix may list.
const maxPorts = 7

// maxRules bounds a sandbox's rules (after host names are resolved).
const maxRules = 1024

// Rule is what a sandbox may do with the destinations in Prefix (IPv4).
// Longest prefix wins; a refusing rule carves an exception out of a wider
// allowing one.
type Rule struct {
	Prefix netip.Prefix
	Allow  bool
	// Ports limits an allowing rule to these destination ports; empty is
	// every port.
	Ports []uint16
}

// Enforcer holds the node's programs and maps.
type Enforcer struct {
	deny, policies *ebpf.Map
	progs          map[ebpf.AttachType]*ebpf.Program
}

// value is a rule as the programs read it.
type value struct {
	Allow uint8
	_     uint8
	Ports [maxPorts]uint16 // network order; Ports[0] == 0: every port
}

type key struct {
	PrefixLen uint32
	Addr      [4]byte
}

func innerSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Type: ebpf.LPMTrie, KeySize: 8, ValueSize: 16, MaxEntries: maxRules,
		Flags: unix.BPF_F_NO_PREALLOC,
	}
}

// New loads the programs, and the maps pinned in pinDir (a bpffs it mounts
// there if needed) or new ones.
func New(pinDir string) (*Enforcer, error) {
	if err := mountBPFFS(pinDir); err != nil {
		return nil, err
	}
	deny, err := pinnedMap(filepath.Join(pinDir, "deny"), &ebpf.MapSpec{
		Name: "dsec_deny", Type: ebpf.LPMTrie, KeySize: 8, ValueSize: 1, MaxEntries: 4096,
		Flags: unix.BPF_F_NO_PREALLOC,
	})
	if err != nil {
		return nil, err
	}
	policies, err := pinnedMap(filepath.Join(pinDir, "policies"), &ebpf.MapSpec{
		Name: "dsec_policies", Type: ebpf.HashOfMaps, KeySize: 8, ValueSize: 4, MaxEntries: 65536,
		InnerMap: innerSpec(),
	})
	if err != nil {
		deny.Close()
		return nil, err
	}
	e := &Enforcer{deny: deny, policies: policies, progs: map[ebpf.AttachType]*ebpf.Program{}}
	for _, p := range []struct {
		attach ebpf.AttachType
		typ    ebpf.ProgramType
		insns  asm.Instructions
	}{
		{ebpf.AttachCGroupInet4Connect, ebpf.CGroupSockAddr, sockAddr4(deny, policies)},
		{ebpf.AttachCGroupUDP4Sendmsg, ebpf.CGroupSockAddr, sockAddr4(deny, policies)},
		{ebpf.AttachCGroupInet6Connect, ebpf.CGroupSockAddr, sockAddr6(deny, policies)},
		{ebpf.AttachCGroupUDP6Sendmsg, ebpf.CGroupSockAddr, sockAddr6(deny, policies)},
		{ebpf.AttachCGroupInetEgress, ebpf.CGroupSKB, skbEgress(deny, policies)},
	} {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: "dsec_egress", Type: p.typ, AttachType: p.attach, Instructions: p.insns, License: "GPL",
		})
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("load egress program for %s: %w", p.attach, err)
		}
		e.progs[p.attach] = prog
	}
	return e, nil
}

func pinnedMap(path string, spec *ebpf.MapSpec) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err == nil {
		return m, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("load pinned map %s: %w", path, err)
	}
	m, err = ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("create map %s: %w", spec.Name, err)
	}
	if err := m.Pin(path); err != nil {
		m.Close()
		return nil, fmt.Errorf("pin map %s: %w", path, err)
	}
	return m, nil
}

func mountBPFFS(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bpffs: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("bpffs: %w", err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on %s: %w", dir, err)
	}
	return nil
}

// Close releases the edge's handles; attached programs and pinned maps
// stay.
func (e *Enforcer) Close() error {
	for _, p := range e.progs {
		p.Close()
	}
	e.deny.Close()
	e.policies.Close()
	return nil
}

// SetDeny replaces the node's deny list.
func (e *Enforcer) SetDeny(prefixes []netip.Prefix) error {
	want := map[key]bool{}
	for _, p := range prefixes {
		k, err := keyOf(p)
		if err != nil {
			return err
		}
		want[k] = true
		if err := e.deny.Update(k, uint8(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("deny %s: %w", p, err)
		}
	}
	var k key
	var v uint8
	var stale []key
	it := e.deny.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	for _, k := range stale {
		e.deny.Delete(k)
	}
	return it.Err()
}

// Attach attaches the programs to the cgroup v2 directory and returns its
// id, the key of the sandbox's rules. Until SetRules the sandbox reaches
// nothing beyond itself.
func (e *Enforcer) Attach(cgroupDir string) (uint64, error) {
	f, err := os.Open(cgroupDir)
	if err != nil {
		return 0, fmt.Errorf("attach egress programs: %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("attach egress programs: %w", err)
	}
	for _, at := range slices.Sorted(func(yield func(ebpf.AttachType) bool) {
		for at := range e.progs {
			if !yield(at) {
				return
			}
		}
	}) {
		err := link.RawAttachProgram(link.RawAttachProgramOptions{
			Target: int(f.Fd()), Program: e.progs[at], Attach: at, Flags: unix.BPF_F_ALLOW_MULTI,
		})
		if err != nil {
			return 0, fmt.Errorf("attach egress program %s to %s: %w", at, cgroupDir, err)
		}
	}
	return st.Ino, nil
}

// SetRules replaces a sandbox's rules in one step: connections and packets
// judged after it returns see only the new rules.
func (e *Enforcer) SetRules(cgid uint64, rules []Rule) error {
	if len(rules) > maxRules {
		return fmt.Errorf("%d network rules, more than %d", len(rules), maxRules)
	}
	entries := map[key]value{}
	for _, r := range rules {
		k, err := keyOf(r.Prefix)
		if err != nil {
			return err
		}
		v, seen := entries[k]
		switch {
		case !seen:
			v = value{Allow: b2u(r.Allow)}
			if err := addPorts(&v, r.Ports); err != nil {
				return fmt.Errorf("%s: %w", r.Prefix, err)
			}
		case v.Allow == 0 || !r.Allow:
			v = value{} // a refusal wins over an allowance of the same prefix
		case v.Ports[0] == 0 || len(r.Ports) == 0:
			v.Ports = [maxPorts]uint16{} // every port
		default:
			if err := addPorts(&v, r.Ports); err != nil {
				return fmt.Errorf("%s: %w", r.Prefix, err)
			}
		}
		entries[k] = v
	}
	widen(entries)
	inner, err := ebpf.NewMap(innerSpec())
	if err != nil {
		return fmt.Errorf("network rules: %w", err)
	}
	defer inner.Close() // the outer map keeps its own reference
	for k, v := range entries {
		if err := inner.Update(k, v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("network rules: %w", err)
		}
	}
	if err := e.policies.Update(cgid, inner, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("network rules: %w", err)
	}
	return nil
}

// Forget drops a sandbox's rules.
func (e *Enforcer) Forget(cgid uint64) {
	e.policies.Delete(cgid)
}

// widen makes a narrower allowing rule allow at least what the nearest
// wider rule around it allows: the longest prefix decides, so without it
// "1.2.3.4:53" inside an allowed "0.0.0.0/0" would close the other ports
// of 1.2.3.4. A refusal in between (a carve-out) stops the widening.
func widen(entries map[key]value) {
	keys := slices.SortedFunc(maps.Keys(entries), func(a, b key) int { return int(a.PrefixLen) - int(b.PrefixLen) })
	for i, k := range keys {
		v := entries[k]
		if v.Allow == 0 || v.Ports[0] == 0 {
			continue
		}
		p := netip.PrefixFrom(netip.AddrFrom4(k.Addr), int(k.PrefixLen))
		for j := i - 1; j >= 0; j-- {
			w := keys[j]
			if w.PrefixLen == k.PrefixLen || !netip.PrefixFrom(netip.AddrFrom4(w.Addr), int(w.PrefixLen)).Contains(p.Addr()) {
				continue
			}
			wv := entries[w] // already widened: shorter prefixes come first
			if wv.Allow != 0 {
				if wv.Ports[0] == 0 {
					v.Ports = [maxPorts]uint16{}
				} else {
					for _, port := range wv.Ports {
						if port != 0 && !slices.Contains(v.Ports[:], port) {
							if i := slices.Index(v.Ports[:], 0); i >= 0 {
								v.Ports[i] = port
							}
						}
					}
				}
				entries[k] = v
			}
			break
		}
	}
}

func addPorts(v *value, ports []uint16) error {
	for _, p := range ports {
		be := p>>8 | p<<8 // network order, as the programs load it
		if slices.Contains(v.Ports[:], be) {
			continue
		}
		i := slices.Index(v.Ports[:], 0)
		if i < 0 {
			return fmt.Errorf("more than %d ports for one destination", maxPorts)
		}
		v.Ports[i] = be
	}
	return nil
}

func keyOf(p netip.Prefix) (key, error) {
	if !p.Addr().Is4() {
		return key{}, fmt.Errorf("prefix %s: only IPv4 is supported", p)
	}
	p = p.Masked()
	return key{PrefixLen: uint32(p.Bits()), Addr: p.Addr().As4()}, nil
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
