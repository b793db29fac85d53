package seccomp

import (
	"fmt"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// interval is a run of system call numbers with one outcome: a return
// value, or the block of argument checks of one system call.
type interval struct {
	start   uint32
	ret     uint32
	block   label
	isBlock bool
}

// section emits one architecture's part of the filter, with the system
// call number in A: runc's ENOSYS stub, then a binary search over the
// numbers (libseccomp's chain of comparisons, but in log n steps), then
// the argument checks.
func section(a *asm, ar arch, rules map[int64][]rule, def uint32, stub bool, last int64) error {
	enosys := a.label()
	if stub && last >= 0 {
		a.farJump(bpf.JumpGreaterThan, uint32(last), enosys)
	}
	type block struct {
		l     label
		rules []rule
	}
	var blocks []block
	var ivs []interval
	add := func(iv interval) {
		if n := len(ivs); n > 0 && !iv.isBlock && !ivs[n-1].isBlock && ivs[n-1].ret == iv.ret {
			return // same outcome as the run before
		}
		ivs = append(ivs, iv)
	}
	cur := uint64(ar.base)
	for _, nr := range slices.Sorted(func(yield func(int64) bool) {
		for nr := range rules {
			if !yield(nr) {
				return
			}
		}
	}) {
		if uint64(nr) > cur {
			add(interval{start: uint32(cur), ret: def})
		}
		ret, cond, err := outcome(rules[nr])
		if err != nil {
			return fmt.Errorf("seccomp: %s system call %d: %w", ar.oci, nr, err)
		}
		if cond == nil {
			add(interval{start: uint32(nr), ret: ret})
		} else {
			l := a.label()
			blocks = append(blocks, block{l, cond})
			add(interval{start: uint32(nr), block: l, isBlock: true})
		}
		cur = uint64(nr) + 1
	}
	if cur <= 1<<32-1 {
		add(interval{start: uint32(cur), ret: def})
	}
	tree(a, ivs)
	for _, b := range blocks {
		a.mark(b.l)
		checks(a, ar, b.rules, def)
	}
	a.mark(enosys)
	a.ret(retErrno | uint32(unix.ENOSYS))
	return nil
}

// outcome is a system call's return value when a rule of it has no
// conditions (libseccomp: it supersedes conditional ones), else its
// conditional rules, which must share one action.
func outcome(rs []rule) (ret uint32, cond []rule, err error) {
	uncond := -1
	for i, r := range rs {
		if len(r.conds) == 0 {
			if uncond >= 0 && rs[uncond].action != r.action {
				return 0, nil, fmt.Errorf("rules with different actions")
			}
			uncond = i
		}
	}
	for _, r := range rs {
		if uncond >= 0 && r.action != rs[uncond].action || r.action != rs[0].action {
			return 0, nil, fmt.Errorf("conditional rules with different actions are not supported")
		}
	}
	if uncond >= 0 {
		return rs[uncond].action, nil, nil
	}
	return 0, rs, nil
}

// tree emits a binary search of A over ivs (sorted by start, covering
// every number A can hold here).
func tree(a *asm, ivs []interval) {
	if len(ivs) == 1 {
		if ivs[0].isBlock {
			a.goTo(ivs[0].block)
		} else {
			a.ret(ivs[0].ret)
		}
		return
	}
	mid := len(ivs) / 2
	right := a.label()
	a.farJump(bpf.JumpGreaterOrEqual, ivs[mid].start, right)
	tree(a, ivs[:mid])
	a.mark(right)
	tree(a, ivs[mid:])
}

// skip is a label n instructions past the next one, placed now.
func (a *asm) skip(n int) label {
	l := a.label()
	a.labels[l] = len(a.ins) + 1 + n
	return l
}

// checks emits a system call's conditional rules: the first whose
// conditions all hold returns its action; if none does, the default.
func checks(a *asm, ar arch, rs []rule, def uint32) {
	for _, r := range rs {
		fail := a.label()
		for _, c := range r.conds {
			cond(a, ar, c, fail)
		}
		a.ret(r.action)
		a.mark(fail)
	}
	a.ret(def)
}

// cond emits one argument comparison that falls through when it holds
// and jumps to fail otherwise: on the full 64 bits where libseccomp's
// architecture is 64-bit, on the low word alone where it is 32-bit.
func cond(a *asm, ar arch, c specs.LinuxSeccompArg, fail label) {
	lo := uint32(offArgs + 8*c.Index)
	hi := lo + 4
	v, v2 := c.Value, c.ValueTwo
	if ar.bits == 32 {
		word := func(x uint64) uint32 { return uint32(x) }
		a.load(lo)
		switch c.Op {
		case specs.OpEqualTo:
			a.jump(bpf.JumpEqual, word(v), next, fail)
		case specs.OpNotEqual:
			a.jump(bpf.JumpEqual, word(v), fail, next)
		case specs.OpLessThan:
			a.jump(bpf.JumpGreaterOrEqual, word(v), fail, next)
		case specs.OpLessEqual:
			a.jump(bpf.JumpGreaterThan, word(v), fail, next)
		case specs.OpGreaterThan:
			a.jump(bpf.JumpGreaterThan, word(v), next, fail)
		case specs.OpGreaterEqual:
			a.jump(bpf.JumpGreaterOrEqual, word(v), next, fail)
		case specs.OpMaskedEqual:
			a.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: word(v)})
			a.jump(bpf.JumpEqual, word(v2), next, fail)
		}
		return
	}
	vhi, vlo := uint32(v>>32), uint32(v)
	ok := a.label()
	switch c.Op {
	case specs.OpEqualTo:
		a.load(hi)
		a.jump(bpf.JumpEqual, vhi, next, fail)
		a.load(lo)
		a.jump(bpf.JumpEqual, vlo, next, fail)
	case specs.OpNotEqual:
		a.load(hi)
		a.jump(bpf.JumpEqual, vhi, next, ok)
		a.load(lo)
		a.jump(bpf.JumpEqual, vlo, fail, next)
	case specs.OpLessThan, specs.OpLessEqual:
		a.load(hi)
		a.jump(bpf.JumpGreaterThan, vhi, fail, next)
		a.jump(bpf.JumpEqual, vhi, next, ok)
		a.load(lo)
		if c.Op == specs.OpLessThan {
			a.jump(bpf.JumpGreaterOrEqual, vlo, fail, next)
		} else {
			a.jump(bpf.JumpGreaterThan, vlo, fail, next)
		}
	case specs.OpGreaterThan, specs.OpGreaterEqual:
		a.load(hi)
		a.jump(bpf.JumpGreaterThan, vhi, ok, next)
		a.jump(bpf.JumpEqual, vhi, next, fail)
		a.load(lo)
		if c.Op == specs.OpGreaterThan {
			a.jump(bpf.JumpGreaterThan, vlo, next, fail)
		} else {
			a.jump(bpf.JumpGreaterOrEqual, vlo, next, fail)
		}
	case specs.OpMaskedEqual:
		a.load(hi)
		a.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: uint32(v >> 32)})
		a.jump(bpf.JumpEqual, uint32(v2>>32), next, fail)
		a.load(lo)
		a.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: uint32(v)})
		a.jump(bpf.JumpEqual, uint32(v2), next, fail)
	}
	a.mark(ok)
}
