package edge_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
)

// A node's heartbeat lists the layers its disk holds, as StoreLayers
// finds them, not the layers its sandboxes used lately: a layer fetched
// (by a create, or by another process sharing the directory) shows, a
// fetch under way does not, and an unchanged list is not sent again.
func TestHeartbeatCarriesTheCache(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	sl, err := edge.NewStoreLayers(edge.StoreLayersConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	put := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "meta", name), []byte("erofs"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
	put(a + ".erofs")
	put(".fetch-123")
	e, err := edge.New(ctx, edge.Config{NodeID: "n1", Layers: sl, Capacity: api.Resources{CPU: 1, MemoryMB: 512},
		Load: func(context.Context) api.NodeLoad { return api.NodeLoad{} }})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Heartbeat(ctx, edge.JoinConfig{}, true).Layers; !slices.Equal(got, []string{"sha256:" + a}) {
		t.Fatalf("heartbeat layers %v, want the one on disk", got)
	}
	if got := e.Heartbeat(ctx, edge.JoinConfig{}, false).Layers; got != nil {
		t.Fatalf("an unchanged cache was sent again: %v", got)
	}
	put(b + ".erofs")
	if got := e.Heartbeat(ctx, edge.JoinConfig{}, false).Layers; !slices.Equal(got, []string{"sha256:" + a, "sha256:" + b}) {
		t.Fatalf("heartbeat layers %v, want both on disk", got)
	}
}
