package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The KVM probe's answer is kept for one host kernel, QEMU version and
// guest kernel: the key is the same on every start (no boot id) and
// changes with QEMU's version.
func TestProbeKey(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	bin := filepath.Join(dir, "qemu-system-x86_64")
	fake := func(version string) {
		t.Helper()
		if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'QEMU emulator version "+version+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	kernel := filepath.Join(dir, "vmlinuz")
	if err := os.WriteFile(kernel, []byte("kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	fake("7.2.0")
	k1, k2 := probeKey(ctx, bin, kernel), probeKey(ctx, bin, kernel)
	if k1 != k2 || !strings.Contains(k1, "QEMU emulator version 7.2.0") {
		t.Fatalf("keys %q and %q: want the same, naming QEMU's version", k1, k2)
	}
	fake("8.0.0")
	if k3 := probeKey(ctx, bin, kernel); k3 == k1 {
		t.Fatalf("a new QEMU keeps the key %q", k3)
	}
}
