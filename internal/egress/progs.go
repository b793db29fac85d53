package egress

import (
	"github.com/cilium/ebpf/asm"
)

// Offsets in struct bpf_sock_addr and struct __sk_buff (uapi/linux/bpf.h).
const (
	saUserIP4  = 4
	saUserIP6  = 8
	saUserPort = 24
	skbProto   = 16
)

// The programs return 1 to let a connection or packet through, 0 to refuse
// it (connect and sendmsg then fail with EPERM).
const (
	verdictDeny  = 0
	verdictAllow = 1
)

// Byte patterns as a little-endian load of network-order data sees them.
const (
	le16IPv4     = 0x0008     // ETH_P_IP
	le16IPv6     = 0xDD86     // ETH_P_IPV6
	le32One      = 0x01000000 // 0.0.0.1, the last word of ::1
	le32V4Mapped = -65536     // 0x0000ffff as bytes 00 00 ff ff: ::ffff:a.b.c.d
)

// Stack layout shared by the programs (stack accesses must be aligned).
const (
	stRuleKey = -24 // struct { u32 prefixlen; u64 cgid; u32 gen; u8 addr[4]; } unpadded: 20 bytes
	stDenyKey = -32 // struct { u32 prefixlen; u8 addr[4]; }
	stCgid    = -40 // u64 cgroup id
	stHdr     = -72 // 24 bytes of a packet header
	stPort    = -76 // u16 destination port
)

// check decides on the address in R7 (IPv4, network order), the port in
// R8 (network order in the low 16 bits; 0 if none) and the cgroup id in
// R9: loopback and the unspecified address are always allowed; the node's
// deny list always wins; then the sandbox's rules of its current
// generation, longest prefix first. A sandbox without rules gets nothing.
func check(m egressMaps) asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.R7).WithSymbol("check"),
		asm.And.Imm(asm.R1, 0xff),
		asm.JEq.Imm(asm.R1, 127, "allow"),
		asm.JEq.Imm(asm.R1, 0, "allow"),
		asm.StoreImm(asm.RFP, stDenyKey, 32, asm.Word),
		asm.StoreMem(asm.RFP, stDenyKey+4, asm.R7, asm.Word),
		asm.LoadMapPtr(asm.R1, m.deny.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stDenyKey),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "deny"),
		asm.StoreMem(asm.RFP, stCgid, asm.R9, asm.DWord),
		asm.LoadMapPtr(asm.R1, m.gens.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stCgid),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "deny"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.StoreMem(asm.RFP, stRuleKey+12, asm.R1, asm.Word),
		asm.StoreImm(asm.RFP, stRuleKey, ruleKeyFixedBits+32, asm.Word),
		asm.StoreMem(asm.RFP, stRuleKey+4, asm.R9, asm.Word), // low half, as a little-endian u64
		asm.Mov.Reg(asm.R1, asm.R9),
		asm.RSh.Imm(asm.R1, 32),
		asm.StoreMem(asm.RFP, stRuleKey+8, asm.R1, asm.Word),
		asm.StoreMem(asm.RFP, stRuleKey+16, asm.R7, asm.Word),
		asm.LoadMapPtr(asm.R1, m.rules.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stRuleKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "deny"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Byte),
		asm.JEq.Imm(asm.R1, 0, "deny"),
		asm.LoadMem(asm.R1, asm.R0, 2, asm.Half),
		asm.JEq.Imm(asm.R1, 0, "allow"), // no port list: every port
		asm.And.Imm(asm.R8, 0xffff),
		asm.JEq.Reg(asm.R1, asm.R8, "allow"),
	}
	for i := 1; i < maxPorts; i++ {
		insns = append(insns,
			asm.LoadMem(asm.R1, asm.R0, int16(2+2*i), asm.Half),
			asm.JEq.Imm(asm.R1, 0, "deny"),
			asm.JEq.Reg(asm.R1, asm.R8, "allow"),
		)
	}
	return append(insns,
		asm.Mov.Imm(asm.R0, verdictDeny).WithSymbol("deny"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, verdictAllow).WithSymbol("allow"),
		asm.Return(),
	)
}

// sockAddr4 serves connect4 and sendmsg4.
func sockAddr4(m egressMaps) asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R7, asm.R6, saUserIP4, asm.Word),
		asm.LoadMem(asm.R8, asm.R6, saUserPort, asm.Word),
		asm.FnGetCurrentCgroupId.Call(),
		asm.Mov.Reg(asm.R9, asm.R0),
	}
	return append(insns, check(m)...)
}

// sockAddr6 serves connect6 and sendmsg6: ::1 and :: are local, an
// IPv4-mapped address is judged as IPv4, any other IPv6 address is
// refused (sandboxes have no IPv6 route).
func sockAddr6(m egressMaps) asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, saUserIP6, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, saUserIP6+4, asm.Word),
		asm.LoadMem(asm.R4, asm.R6, saUserIP6+8, asm.Word),
		asm.LoadMem(asm.R7, asm.R6, saUserIP6+12, asm.Word),
		asm.JNE.Imm(asm.R2, 0, "deny"),
		asm.JNE.Imm(asm.R3, 0, "deny"),
		asm.JEq.Imm(asm.R4, 0, "local6"),
		asm.JNE.Imm32(asm.R4, le32V4Mapped, "deny"),
		asm.LoadMem(asm.R8, asm.R6, saUserPort, asm.Word),
		asm.FnGetCurrentCgroupId.Call(),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.Ja.Label("check"),
		asm.JEq.Imm(asm.R7, 0, "allow").WithSymbol("local6"),
		asm.JEq.Imm(asm.R7, le32One, "allow"),
		asm.Ja.Label("deny"),
	}
	return append(insns, check(m)...)
}

// skbEgress judges every IP packet a sandbox's sockets send, whatever the
// protocol: the backstop for what the socket hooks do not see (raw and
// ICMP sockets, SCTP, unconnected sends of other protocols). IPv6 goes
// only to ::1.
func skbEgress(m egressMaps) asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R1, asm.R6, skbProto, asm.Word),
		asm.JEq.Imm(asm.R1, le16IPv4, "ipv4"),
		asm.JEq.Imm(asm.R1, le16IPv6, "ipv6"),
		asm.Ja.Label("allow"), // not IP: nothing to route

		// IPv4: the 20-byte header, then the destination port of TCP
		// and UDP (not in fragments after the first).
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("ipv4"),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stHdr),
		asm.Mov.Imm(asm.R4, 20),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "deny"),
		asm.LoadMem(asm.R7, asm.RFP, stHdr+16, asm.Word),
		asm.Mov.Imm(asm.R8, 0),
		asm.LoadMem(asm.R1, asm.RFP, stHdr+6, asm.Half), // flags and fragment offset
		asm.And.Imm(asm.R1, 0xff1f),                     // offset bits, as loaded
		asm.JNE.Imm(asm.R1, 0, "cgid"),
		asm.LoadMem(asm.R1, asm.RFP, stHdr+9, asm.Byte),
		asm.JEq.Imm(asm.R1, 6, "ports"),
		asm.JEq.Imm(asm.R1, 17, "ports"),
		asm.Ja.Label("cgid"),
		asm.LoadMem(asm.R2, asm.RFP, stHdr, asm.Byte).WithSymbol("ports"),
		asm.And.Imm(asm.R2, 0x0f),
		asm.LSh.Imm(asm.R2, 2),
		asm.Add.Imm(asm.R2, 2),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stPort),
		asm.Mov.Imm(asm.R4, 2),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "deny"),
		asm.LoadMem(asm.R8, asm.RFP, stPort, asm.Half),
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("cgid"),
		asm.FnSkbCgroupId.Call(),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.Ja.Label("check"),

		// IPv6: the destination must be ::1.
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("ipv6"),
		asm.Mov.Imm(asm.R2, 24),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stHdr),
		asm.Mov.Imm(asm.R4, 16),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "deny"),
		asm.LoadMem(asm.R1, asm.RFP, stHdr, asm.DWord),
		asm.JNE.Imm(asm.R1, 0, "deny"),
		asm.LoadMem(asm.R1, asm.RFP, stHdr+8, asm.Word),
		asm.JNE.Imm(asm.R1, 0, "deny"),
		asm.LoadMem(asm.R1, asm.RFP, stHdr+12, asm.Word),
		asm.JEq.Imm(asm.R1, le32One, "allow"),
		asm.Ja.Label("deny"),
	}
	return append(insns, check(m)...)
}
