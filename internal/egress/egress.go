// Package egress enforces where sandboxes may send network traffic, with
// eBPF programs on each sandbox's cgroup (cgroup v2): connect4/connect6
// and sendmsg4/sendmsg6 refuse a connection or datagram to a destination
// the sandbox may not reach (the caller sees EPERM at once), and an
// egress cgroup_skb program drops every other IP packet to such a
// destination (raw, ICMP, SCTP…). The programs read the node's deny list,
// which no sandbox rule overrides, then the sandbox's rules: one LPM trie
// for the whole node keyed by (cgroup id, generation, prefix), and a map
// from cgroup id to the sandbox's current generation. A policy change
// writes the new generation's rules, flips the generation in one map
// update, then deletes the old rules: a connection is judged by the old
// rules or by the new, never by a mix. (A map of maps would swap a
// per-sandbox trie instead, but the kernel waits for an RCU grace period
// on every update of one: tens of milliseconds on each create.)
//
// Programs are attached with BPF_F_ALLOW_MULTI and no link, so they stay
// attached when the edge exits and go with the cgroup; the maps are pinned
// in a bpffs of the backend's own, so a restarted edge finds them again.
// The package must never attach anything outside the cgroups it is given.
package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

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
	m     egressMaps
	progs map[ebpf.AttachType]*ebpf.Program

	mu sync.Mutex
	// live are the rule keys of each sandbox's current generation.
	live map[uint64]*sandboxRules
}

type egressMaps struct {
	deny, gens, rules *ebpf.Map
}

type sandboxRules struct {
	gen  uint32
	keys []ruleKey
}

// value is a rule as the programs read it.
type value struct {
	Allow uint8
	_     uint8
	Ports [maxPorts]uint16 // network order; Ports[0] == 0: every port
}

type denyKey struct {
	PrefixLen uint32
	Addr      [4]byte
}

// ruleKeyFixedBits are the bits of a rule key before the address: the
// cgroup id and the generation, always matched in full.
const ruleKeyFixedBits = 96

// ruleKey is {u32 prefixlen; u64 cgid (little-endian); u32 gen; u8 addr[4]}
// without padding, as the programs lay it out on their stack.
type ruleKey struct {
	PrefixLen uint32
	Data      [16]byte
}

func newRuleKey(cgid uint64, gen uint32, p netip.Prefix) ruleKey {
	k := ruleKey{PrefixLen: uint32(ruleKeyFixedBits + p.Bits())}
	binary.LittleEndian.PutUint64(k.Data[0:8], cgid)
	binary.LittleEndian.PutUint32(k.Data[8:12], gen)
	a := p.Addr().As4()
	copy(k.Data[12:16], a[:])
	return k
}

func (k ruleKey) cgid() uint64 { return binary.LittleEndian.Uint64(k.Data[0:8]) }
func (k ruleKey) gen() uint32  { return binary.LittleEndian.Uint32(k.Data[8:12]) }

// New loads the programs, and the maps pinned in pinDir (a bpffs it mounts
// there if needed) or new ones.
func New(pinDir string) (*Enforcer, error) {
	if err := mountBPFFS(pinDir); err != nil {
		return nil, err
	}
	e := &Enforcer{progs: map[ebpf.AttachType]*ebpf.Program{}, live: map[uint64]*sandboxRules{}}
	var err error
	if e.m.deny, err = pinnedMap(filepath.Join(pinDir, "deny"), &ebpf.MapSpec{
		Name: "dsec_deny", Type: ebpf.LPMTrie, KeySize: 8, ValueSize: 1, MaxEntries: 4096,
		Flags: unix.BPF_F_NO_PREALLOC,
	}); err != nil {
		return nil, err
	}
	if e.m.gens, err = pinnedMap(filepath.Join(pinDir, "gens"), &ebpf.MapSpec{
		Name: "dsec_gens", Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: 1 << 16,
	}); err != nil {
		e.Close()
		return nil, err
	}
	if e.m.rules, err = pinnedMap(filepath.Join(pinDir, "rules"), &ebpf.MapSpec{
		Name: "dsec_rules", Type: ebpf.LPMTrie, KeySize: 20, ValueSize: 16, MaxEntries: 1 << 20,
		Flags: unix.BPF_F_NO_PREALLOC,
	}); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.load(); err != nil {
		e.Close()
		return nil, err
	}
	for _, p := range []struct {
		attach ebpf.AttachType
		typ    ebpf.ProgramType
		insns  asm.Instructions
	}{
		{ebpf.AttachCGroupInet4Connect, ebpf.CGroupSockAddr, sockAddr4(e.m)},
		{ebpf.AttachCGroupUDP4Sendmsg, ebpf.CGroupSockAddr, sockAddr4(e.m)},
		{ebpf.AttachCGroupInet6Connect, ebpf.CGroupSockAddr, sockAddr6(e.m)},
		{ebpf.AttachCGroupUDP6Sendmsg, ebpf.CGroupSockAddr, sockAddr6(e.m)},
		{ebpf.AttachCGroupInetEgress, ebpf.CGroupSKB, skbEgress(e.m)},
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

// load rebuilds, after a restart, which rules belong to which sandbox, and
// drops rules of generations no longer current.
func (e *Enforcer) load() error {
	var cgid uint64
	var gen uint32
	it := e.m.gens.Iterate()
	for it.Next(&cgid, &gen) {
		e.live[cgid] = &sandboxRules{gen: gen}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("egress generations: %w", err)
	}
	var k ruleKey
	var v value
	var stale []ruleKey
	rit := e.m.rules.Iterate()
	for rit.Next(&k, &v) {
		if sr := e.live[k.cgid()]; sr != nil && sr.gen == k.gen() {
			sr.keys = append(sr.keys, k)
		} else {
			stale = append(stale, k)
		}
	}
	if err := rit.Err(); err != nil {
		return fmt.Errorf("egress rules: %w", err)
	}
	for _, k := range stale {
		e.m.rules.Delete(k)
	}
	return nil
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
	for _, x := range []*ebpf.Map{e.m.deny, e.m.gens, e.m.rules} {
		if x != nil {
			x.Close()
		}
	}
	return nil
}

// SetDeny replaces the node's deny list.
func (e *Enforcer) SetDeny(prefixes []netip.Prefix) error {
	want := map[denyKey]bool{}
	for _, p := range prefixes {
		if !p.Addr().Is4() {
			return fmt.Errorf("prefix %s: only IPv4 is supported", p)
		}
		p = p.Masked()
		k := denyKey{PrefixLen: uint32(p.Bits()), Addr: p.Addr().As4()}
		want[k] = true
		if err := e.m.deny.Update(k, uint8(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("deny %s: %w", p, err)
		}
	}
	var k denyKey
	var v uint8
	var stale []denyKey
	it := e.m.deny.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	for _, k := range stale {
		e.m.deny.Delete(k)
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
	for _, at := range slices.Sorted(maps.Keys(e.progs)) {
		err := link.RawAttachProgram(link.RawAttachProgramOptions{
			Target: int(f.Fd()), Program: e.progs[at], Attach: at, Flags: unix.BPF_F_ALLOW_MULTI,
		})
		if err != nil {
			return 0, fmt.Errorf("attach egress program %s to %s: %w", at, cgroupDir, err)
		}
	}
	return st.Ino, nil
}

// SetRules replaces a sandbox's rules: connections and packets judged
// after it returns see only the new rules, and none ever sees a mix.
func (e *Enforcer) SetRules(cgid uint64, rules []Rule) error {
	entries, err := compile(rules)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.live[cgid]
	next := &sandboxRules{gen: 1}
	if old != nil {
		next.gen = old.gen + 1
	}
	for p, v := range entries {
		k := newRuleKey(cgid, next.gen, p)
		if err := e.m.rules.Update(k, v, ebpf.UpdateAny); err != nil {
			e.deleteKeys(next.keys)
			return fmt.Errorf("network rules: %w", err)
		}
		next.keys = append(next.keys, k)
	}
	if err := e.m.gens.Update(cgid, next.gen, ebpf.UpdateAny); err != nil {
		e.deleteKeys(next.keys)
		return fmt.Errorf("network rules: %w", err)
	}
	e.live[cgid] = next
	if old != nil {
		e.deleteKeys(old.keys)
	}
	return nil
}

// compile merges rules per prefix and widens narrow allowances.
func compile(rules []Rule) (map[netip.Prefix]value, error) {
	if len(rules) > maxRules {
		return nil, fmt.Errorf("%d network rules, more than %d", len(rules), maxRules)
	}
	entries := map[netip.Prefix]value{}
	for _, r := range rules {
		if !r.Prefix.Addr().Is4() {
			return nil, fmt.Errorf("prefix %s: only IPv4 is supported", r.Prefix)
		}
		p := r.Prefix.Masked()
		v, seen := entries[p]
		switch {
		case !seen:
			v = value{Allow: b2u(r.Allow)}
			if err := addPorts(&v, r.Ports); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
		case v.Allow == 0 || !r.Allow:
			v = value{} // a refusal wins over an allowance of the same prefix
		case v.Ports[0] == 0 || len(r.Ports) == 0:
			v.Ports = [maxPorts]uint16{} // every port
		default:
			if err := addPorts(&v, r.Ports); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
		}
		entries[p] = v
	}
	widen(entries)
	return entries, nil
}

// Forget drops a sandbox's rules.
func (e *Enforcer) Forget(cgid uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.m.gens.Delete(cgid)
	if sr := e.live[cgid]; sr != nil {
		e.deleteKeys(sr.keys)
	}
	delete(e.live, cgid)
}

func (e *Enforcer) deleteKeys(keys []ruleKey) {
	for _, k := range keys {
		e.m.rules.Delete(k)
	}
}

// widen makes a narrower allowing rule allow at least what the nearest
// wider rule around it allows: the longest prefix decides, so without it
// "1.2.3.4:53" inside an allowed "0.0.0.0/0" would close the other ports
// of 1.2.3.4. A refusal in between (a carve-out) stops the widening.
func widen(entries map[netip.Prefix]value) {
	keys := slices.SortedFunc(maps.Keys(entries), func(a, b netip.Prefix) int { return a.Bits() - b.Bits() })
	for i, k := range keys {
		v := entries[k]
		if v.Allow == 0 || v.Ports[0] == 0 {
			continue
		}
		for j := i - 1; j >= 0; j-- {
			w := keys[j]
			if w.Bits() == k.Bits() || !w.Contains(k.Addr()) {
				continue
			}
			if wv := entries[w]; wv.Allow != 0 { // already widened: shorter prefixes come first
				if wv.Ports[0] == 0 {
					v.Ports = [maxPorts]uint16{}
				} else {
					for _, port := range wv.Ports {
						if port != 0 && !slices.Contains(v.Ports[:], port) {
							if n := slices.Index(v.Ports[:], 0); n >= 0 {
								v.Ports[n] = port
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

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
