package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestLayerGC checks that the layers dsec makes for itself go once
// nothing uses them: a fork's layer when its copies are gone (another
// fork's, whose copy lives, stays), and a Dockerfile step's cache layer
// when no layer stacks on it and no build used it lately (a flattened
// result's; a result kept as layers keeps its steps' layers). The cache
// TTL is 10 s: long enough for a build to use its own steps' layers.
func TestLayerGC(t *testing.T) {
	s := startServer(t, "--trajectory-retention", "10s", "--fork-layer-grace", "1ms", "--build-cache-ttl", "10s")
	c := s.Client
	ctx := ctxT(t)

	names := func() map[string]bool {
		t.Helper()
		list, err := c.ListLayers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, l := range list {
			out[l.Name+":"+l.Tag] = true
		}
		return out
	}
	cacheLayers := func(before map[string]bool) []string {
		var out []string
		for n := range names() {
			if strings.HasPrefix(n, "build-cache/") && !before[n] {
				out = append(out, n)
			}
		}
		return out
	}

	parent := newSandbox(t, c, nil)
	sh(t, c, parent.ID, "echo x > /x")
	kept, err := c.Fork(ctx, parent.ID, &api.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), kept.Sandboxes[0].ID) })
	sh(t, c, parent.ID, "echo y > /y") // a fork layer of its own (the same changes would pack to the same digest)
	gone, err := c.Fork(ctx, parent.ID, &api.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, gone.Sandboxes[0].ID); err != nil {
		t.Fatal(err)
	}

	before := names()
	if _, err := c.BuildLayer(ctx, client.BuildOptions{Name: "gc-kept:1"},
		buildCtx(t, "FROM base:minimal\nRUN echo kept > /kept\n"), nil); err != nil {
		t.Fatal(err)
	}
	keptCache := cacheLayers(before)
	before = names()
	if _, err := c.BuildLayer(ctx, client.BuildOptions{Name: "gc-flat:1", Flatten: true},
		buildCtx(t, "FROM base:minimal\nRUN echo flat > /flat\n"), nil); err != nil {
		t.Fatal(err)
	}
	flatCache := cacheLayers(before)
	if len(keptCache) != 1 || len(flatCache) != 1 {
		t.Fatalf("cache layers: kept %v, flattened %v", keptCache, flatCache)
	}

	testutil.Eventually(t, 60*time.Second, "unused layers collected", func() error {
		n := names()
		if n[gone.Layer] || n[flatCache[0]] {
			return fmt.Errorf("fork %v, build cache %v", n[gone.Layer], n[flatCache[0]])
		}
		// Collected in the same pass as these went: they stay.
		if !n[kept.Layer] || !n[keptCache[0]] || !n["gc-kept:1"] || !n["gc-flat:1"] {
			t.Fatalf("a layer in use was collected: %v", n)
		}
		return nil
	})
	// The live copy still has its files.
	if got := sh(t, c, kept.Sandboxes[0].ID, "cat /x"); got != "x\n" {
		t.Fatalf("the kept copy: %q", got)
	}
	sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "gc-flat:1"}})
	if err != nil {
		t.Fatalf("create from the flattened build after its cache went: %v", err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	if got := sh(t, c, sb.ID, "cat /flat"); got != "flat\n" {
		t.Fatalf("the flattened build: %q", got)
	}
}
