package layer

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/dsec-project/dsec/internal/testutil"
)

// TestNormalizeSuperblock checks our CRC against the one mkfs.erofs wrote,
// and that normalizing zeroes the build time and keeps the CRC valid.
func TestNormalizeSuperblock(t *testing.T) {
	testutil.Require(t, testutil.Tool(mkfsTool))
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "img.erofs")
	if b, err := exec.Command(mkfsTool, mkfsArgs(src, out, "")...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", mkfsTool, err, b)
	}
	block := func() []byte {
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		n := 1<<data[superOffset+offBlkszBits] - superOffset
		return data[superOffset : superOffset+n]
	}

	before := block()
	if binary.LittleEndian.Uint32(before[offFeatCompat:])&featSbChecksum == 0 {
		t.Fatal("mkfs.erofs wrote no superblock checksum")
	}
	if got, want := superblockChecksum(before), binary.LittleEndian.Uint32(before[offChecksum:]); got != want {
		t.Fatalf("our checksum %08x, mkfs.erofs's %08x", got, want)
	}
	if binary.LittleEndian.Uint64(before[offBuildTime:]) == 0 {
		t.Fatal("mkfs.erofs wrote a zero build time: nothing to normalize")
	}

	if err := normalizeSuperblock(out); err != nil {
		t.Fatal(err)
	}
	after := block()
	if bt, ns := binary.LittleEndian.Uint64(after[offBuildTime:]), binary.LittleEndian.Uint32(after[offBuildNsec:]); bt != 0 || ns != 0 {
		t.Errorf("build time %d.%09d after normalizing", bt, ns)
	}
	if got, want := superblockChecksum(after), binary.LittleEndian.Uint32(after[offChecksum:]); got != want {
		t.Errorf("checksum after normalizing %08x, stored %08x", got, want)
	}
}
