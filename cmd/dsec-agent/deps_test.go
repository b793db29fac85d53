package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksNoBuilders keeps the layer, blob and initramfs builders and
// their codecs out of the agent: every package it links costs its
// initialisers' heap and dirty data in every sandbox (~100 KB when a
// digest check and three paths pulled them in).
func TestLinksNoBuilders(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	banned := []string{
		"github.com/dsec-project/dsec/internal/layer",
		"github.com/dsec-project/dsec/internal/blob",
		"github.com/dsec-project/dsec/internal/initramfs",
		"github.com/dsec-project/dsec/internal/vmimage",
		"github.com/klauspost/compress/zstd",
		"github.com/ulikunitz/xz",
		"archive/tar",
		"debug/elf",
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps gave %d packages: %q", len(deps), out)
	}
	for _, d := range deps {
		for _, b := range banned {
			if d == b {
				t.Errorf("dsec-agent links %s", d)
			}
		}
	}
}
