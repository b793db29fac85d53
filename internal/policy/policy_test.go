package policy

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/egress"
)

func TestParseDest(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Dest
		bad  bool
	}{
		{in: "203.0.113.7", want: Dest{Prefix: netip.MustParsePrefix("203.0.113.7/32")}},
		{in: "203.0.113.9/24", want: Dest{Prefix: netip.MustParsePrefix("203.0.113.0/24")}},
		{in: "203.0.113.7:443", want: Dest{Prefix: netip.MustParsePrefix("203.0.113.7/32"), Port: 443}},
		{in: "203.0.113.0/24:53", want: Dest{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Port: 53}},
		{in: "PyPI.org:443", want: Dest{Host: "pypi.org", Port: 443}},
		{in: "example.com.", want: Dest{Host: "example.com"}},
		{in: "1.2.3.4:0", bad: true},
		{in: "1.2.3.4:65536", bad: true},
		{in: "[2001:db8::1]:443", bad: true},
		{in: "2001:db8::/32", bad: true},
		{in: "", bad: true},
		{in: "bad host!", bad: true},
		{in: "-x.com", bad: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseDest(tc.in)
			if (err != nil) != tc.bad {
				t.Fatalf("error %v, want bad=%v", err, tc.bad)
			}
			if !tc.bad && got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return f[host], nil
}

func TestRules(t *testing.T) {
	self := netip.MustParseAddr("198.18.0.2")
	dns := []netip.Addr{netip.MustParseAddr("192.0.2.53")}
	r := fakeResolver{"pypi.org": {netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")}}
	pfx := netip.MustParsePrefix
	selfRule := egress.Rule{Prefix: pfx("198.18.0.2/32"), Allow: true}
	dnsRule := egress.Rule{Prefix: pfx("192.0.2.53/32"), Allow: true, Ports: []uint16{53}}
	for _, tc := range []struct {
		name string
		n    api.Network
		want []egress.Rule
	}{
		{"none: itself only", api.Network{Mode: api.NetworkNone}, []egress.Rule{selfRule}},
		{"allowlist: names resolved, DNS allowed", api.Network{Mode: api.NetworkAllowlist, Allow: []string{"pypi.org:443", "203.0.113.0/28"}},
			[]egress.Rule{selfRule, dnsRule,
				{Prefix: pfx("203.0.113.10/32"), Allow: true, Ports: []uint16{443}},
				{Prefix: pfx("203.0.113.11/32"), Allow: true, Ports: []uint16{443}},
				{Prefix: pfx("203.0.113.0/28"), Allow: true}}},
		{"open: all but private ranges", api.Network{Mode: api.NetworkOpen},
			[]egress.Rule{selfRule, dnsRule, {Prefix: pfx("0.0.0.0/0"), Allow: true},
				{Prefix: pfx("10.0.0.0/8")}, {Prefix: pfx("172.16.0.0/12")}, {Prefix: pfx("192.168.0.0/16")}, {Prefix: pfx("100.64.0.0/10")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Rules(context.Background(), tc.n, dns, self, r)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, tc.want, func(a, b egress.Rule) bool {
				return a.Prefix == b.Prefix && a.Allow == b.Allow && slices.Equal(a.Ports, b.Ports)
			}) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestCheckPhases(t *testing.T) {
	ok := map[string]api.Phase{
		"setup": {Network: &api.Network{Mode: api.NetworkOpen}},
		"agent": {Files: &api.FileRules{Deny: []string{"/eval"}}},
	}
	for _, tc := range []struct {
		name    string
		phases  map[string]api.Phase
		initial string
		bad     bool
	}{
		{"none at all", nil, "", false},
		{"a phase without phases", nil, "x", true},
		{"good", ok, "setup", false},
		{"no initial", ok, "", true},
		{"unknown initial", ok, "eval", true},
		{"bad name", map[string]api.Phase{"Setup": {}}, "Setup", true},
		{"bad network", map[string]api.Phase{"a": {Network: &api.Network{Mode: "wide"}}}, "a", true},
		{"dotdot", map[string]api.Phase{"a": {Files: &api.FileRules{ReadOnly: []string{"/x/../etc"}}}}, "a", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := CheckPhases(tc.phases, tc.initial); (err != nil) != tc.bad {
				t.Fatalf("error %v, want bad=%v", err, tc.bad)
			}
		})
	}
}
