package container

import (
	"slices"
	"testing"

	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/idmap"
)

// TestAgentStartsWithOneP: the agent is started with GOMAXPROCS=1 (an
// idle agent that starts with a P per core and cuts to one keeps up to
// ~0.5 MiB more) and told that the variable is its own, to unset before
// any command inherits it; a sandbox's own GOMAXPROCS is left alone.
func TestAgentStartsWithOneP(t *testing.T) {
	args := []string{agentPath, "--listen-fd", "3"}
	s, err := ociSpec(backend.Spec{ID: "sb-a"}, idmap.Range{Base: 1 << 20}, "/rootfs", "/dsec/sb-a", "/runtime", args)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Process.Env, "GOMAXPROCS=1") || !slices.Contains(s.Process.Args, "--own-gomaxprocs") {
		t.Fatalf("agent env %q args %q: want GOMAXPROCS=1 and --own-gomaxprocs", s.Process.Env, s.Process.Args)
	}
	if len(args) != 3 {
		t.Fatalf("ociSpec changed its caller's args: %q", args)
	}

	s, err = ociSpec(backend.Spec{ID: "sb-b", Env: map[string]string{"GOMAXPROCS": "4"}}, idmap.Range{Base: 1 << 20}, "/rootfs", "/dsec/sb-b", "/runtime", args)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(s.Process.Env, "GOMAXPROCS=1") || !slices.Contains(s.Process.Env, "GOMAXPROCS=4") || slices.Contains(s.Process.Args, "--own-gomaxprocs") {
		t.Fatalf("sandbox with GOMAXPROCS=4: agent env %q args %q", s.Process.Env, s.Process.Args)
	}
}
