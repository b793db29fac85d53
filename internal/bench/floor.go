package bench

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
)

// nothingELF is a static x86-64 executable whose one instruction
// sequence is exit(0): no loader, no libc, one page mapped. A fork+exec
// of it is the least any exec costs on a machine, the floor under which no
// sandbox platform's exec of even `true` can go.
func nothingELF() ([]byte, error) {
	if runtime.GOARCH != "amd64" {
		return nil, errors.New("the do-nothing executable is built for amd64 only")
	}
	const base, ehsize, phsize = 0x400000, 64, 56
	code := []byte{
		0xb8, 0x3c, 0x00, 0x00, 0x00, // mov eax, 60 (exit)
		0x31, 0xff, // xor edi, edi
		0x0f, 0x05, // syscall
	}
	size := uint64(ehsize + phsize + len(code))
	b := make([]byte, 0, size)
	le := binary.LittleEndian
	b = append(b, 0x7f, 'E', 'L', 'F', 2 /* 64-bit */, 1 /* little-endian */, 1 /* version */, 0 /* System V */)
	b = append(b, make([]byte, 8)...)
	b = le.AppendUint16(b, 2)    // ET_EXEC
	b = le.AppendUint16(b, 0x3e) // EM_X86_64
	b = le.AppendUint32(b, 1)    // EV_CURRENT
	b = le.AppendUint64(b, base+ehsize+phsize)
	b = le.AppendUint64(b, ehsize) // program headers
	b = le.AppendUint64(b, 0)      // no section headers
	b = le.AppendUint32(b, 0)      // flags
	b = le.AppendUint16(b, ehsize)
	b = le.AppendUint16(b, phsize)
	b = le.AppendUint16(b, 1) // one program header
	b = le.AppendUint16(b, 0)
	b = le.AppendUint16(b, 0)
	b = le.AppendUint16(b, 0)
	b = le.AppendUint32(b, 1) // PT_LOAD
	b = le.AppendUint32(b, 5) // read, execute
	b = le.AppendUint64(b, 0) // from the file's start
	b = le.AppendUint64(b, base)
	b = le.AppendUint64(b, base)
	b = le.AppendUint64(b, size)
	b = le.AppendUint64(b, size)
	b = le.AppendUint64(b, 0x1000)
	return append(b, code...), nil
}

// writeNothing writes nothingELF into dir as an executable and returns its
// path.
func writeNothing(dir string) (string, error) {
	elf, err := nothingELF()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "nothing")
	if err := os.WriteFile(p, elf, 0o755); err != nil {
		return "", err
	}
	return p, nil
}
