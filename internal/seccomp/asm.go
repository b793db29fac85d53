package seccomp

import (
	"fmt"

	"golang.org/x/net/bpf"
)

// asm is a small classic-BPF assembler with forward labels. Conditional
// jumps reach at most 255 instructions ahead, so the code generator keeps
// them local and uses unconditional jumps (32-bit offsets) for far
// targets.
type asm struct {
	ins    []item
	labels []int // label → instruction index, -1 until marked
}

type label int

type item struct {
	ins    bpf.Instruction
	jt, jf label // for conditional jumps; next is "the next instruction"
	ja     label // for unconditional jumps
}

// next is the fall-through target of a conditional jump.
const next label = -1

func (a *asm) label() label {
	a.labels = append(a.labels, -1)
	return label(len(a.labels) - 1)
}

func (a *asm) mark(l label) { a.labels[l] = len(a.ins) }

func (a *asm) emit(i bpf.Instruction) {
	a.ins = append(a.ins, item{ins: i, jt: next, jf: next, ja: next})
}

// load loads the 32-bit word at offset off of struct seccomp_data.
func (a *asm) load(off uint32) { a.emit(bpf.LoadAbsolute{Off: off, Size: 4}) }

func (a *asm) ret(k uint32) { a.emit(bpf.RetConstant{Val: k}) }

// jump jumps to jt if A cond k holds, else to jf.
func (a *asm) jump(cond bpf.JumpTest, k uint32, jt, jf label) {
	a.ins = append(a.ins, item{ins: bpf.JumpIf{Cond: cond, Val: k}, jt: jt, jf: jf, ja: next})
}

func (a *asm) goTo(l label) { a.ins = append(a.ins, item{ins: bpf.Jump{}, jt: next, jf: next, ja: l}) }

// assemble resolves the labels and encodes the program.
func (a *asm) assemble() ([]bpf.RawInstruction, error) {
	off := func(pc int, l label, max int) (int, error) {
		if l == next {
			return 0, nil
		}
		t := a.labels[l]
		if t < 0 {
			return 0, fmt.Errorf("seccomp: label %d never placed", l)
		}
		d := t - pc - 1
		if d < 0 || d > max {
			return 0, fmt.Errorf("seccomp: jump from %d to %d out of range", pc, t)
		}
		return d, nil
	}
	out := make([]bpf.Instruction, len(a.ins))
	for pc, it := range a.ins {
		switch ins := it.ins.(type) {
		case bpf.JumpIf:
			jt, err := off(pc, it.jt, 255)
			if err != nil {
				return nil, err
			}
			jf, err := off(pc, it.jf, 255)
			if err != nil {
				return nil, err
			}
			ins.SkipTrue, ins.SkipFalse = uint8(jt), uint8(jf)
			out[pc] = ins
		case bpf.Jump:
			d, err := off(pc, it.ja, 1<<31)
			if err != nil {
				return nil, err
			}
			ins.Skip = uint32(d)
			out[pc] = ins
		default:
			out[pc] = it.ins
		}
	}
	if len(out) > maxInsns {
		return nil, fmt.Errorf("seccomp: program of %d instructions exceeds the kernel's %d", len(out), maxInsns)
	}
	return bpf.Assemble(out)
}

// maxInsns is BPF_MAXINSNS.
const maxInsns = 4096

// farJump jumps to l if A cond k holds, falling through otherwise; l may
// be any distance ahead.
func (a *asm) farJump(cond bpf.JumpTest, k uint32, l label) {
	a.ins = append(a.ins, item{ins: bpf.JumpIf{Cond: cond, Val: k}, jt: next, jf: a.skip(1), ja: next})
	a.goTo(l)
}
