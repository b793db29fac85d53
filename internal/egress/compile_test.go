package egress

import (
	"net/netip"
	"testing"
)

func be(p uint16) uint16 { return p>>8 | p<<8 }

func TestCompile(t *testing.T) {
	pfx := netip.MustParsePrefix
	all := [maxPorts]uint16{}
	for _, tc := range []struct {
		name  string
		rules []Rule
		want  map[netip.Prefix]value
	}{
		{"ports of one prefix merge", []Rule{
			{Prefix: pfx("1.2.3.4/32"), Allow: true, Ports: []uint16{80}},
			{Prefix: pfx("1.2.3.4/32"), Allow: true, Ports: []uint16{443}},
		}, map[netip.Prefix]value{pfx("1.2.3.4/32"): {Allow: 1, Ports: [maxPorts]uint16{be(80), be(443)}}}},
		{"every port wins over a list", []Rule{
			{Prefix: pfx("1.2.3.4/32"), Allow: true, Ports: []uint16{80}},
			{Prefix: pfx("1.2.3.4/32"), Allow: true},
		}, map[netip.Prefix]value{pfx("1.2.3.4/32"): {Allow: 1, Ports: all}}},
		{"a refusal wins over an allowance", []Rule{
			{Prefix: pfx("10.0.0.0/8"), Allow: true},
			{Prefix: pfx("10.0.0.0/8")},
		}, map[netip.Prefix]value{pfx("10.0.0.0/8"): {}}},
		{"a narrow allowance keeps what a wider one allows", []Rule{
			{Prefix: pfx("0.0.0.0/0"), Allow: true},
			{Prefix: pfx("9.9.9.9/32"), Allow: true, Ports: []uint16{53}},
		}, map[netip.Prefix]value{pfx("0.0.0.0/0"): {Allow: 1}, pfx("9.9.9.9/32"): {Allow: 1}}},
		{"a carve-out stops the widening", []Rule{
			{Prefix: pfx("0.0.0.0/0"), Allow: true},
			{Prefix: pfx("10.0.0.0/8")},
			{Prefix: pfx("10.1.2.3/32"), Allow: true, Ports: []uint16{53}},
		}, map[netip.Prefix]value{pfx("0.0.0.0/0"): {Allow: 1}, pfx("10.0.0.0/8"): {},
			pfx("10.1.2.3/32"): {Allow: 1, Ports: [maxPorts]uint16{be(53)}}}},
		{"host bits are masked", []Rule{{Prefix: pfx("1.2.3.4/24"), Allow: true}},
			map[netip.Prefix]value{pfx("1.2.3.0/24"): {Allow: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := compile(tc.rules)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for p, v := range tc.want {
				if got[p] != v {
					t.Fatalf("%s: got %+v, want %+v", p, got[p], v)
				}
			}
		})
	}
	t.Run("too many ports", func(t *testing.T) {
		var rules []Rule
		for p := range uint16(maxPorts + 1) {
			rules = append(rules, Rule{Prefix: pfx("1.2.3.4/32"), Allow: true, Ports: []uint16{p + 1}})
		}
		if _, err := compile(rules); err == nil {
			t.Fatal("accepted more ports than a rule holds")
		}
	})
	t.Run("IPv6", func(t *testing.T) {
		if _, err := compile([]Rule{{Prefix: pfx("2001:db8::/32"), Allow: true}}); err == nil {
			t.Fatal("accepted an IPv6 prefix")
		}
	})
}
