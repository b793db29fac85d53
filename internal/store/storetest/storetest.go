// Package storetest is the behaviour suite every store.Store runs. A new
// implementation passes it before it is wired in anywhere.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// Run runs the suite. open returns a fresh, empty store; reopen returns a
// store over the same data as the last one opened (after it is closed), to
// check durability.
func Run(t *testing.T, open func(t *testing.T) store.Store, reopen func(t *testing.T) store.Store) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)

	t.Run("tenants and keys", func(t *testing.T) {
		s := open(t)
		if err := s.CreateTenant(ctx, store.Tenant{ID: "t1", Name: "one", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		err := s.CreateTenant(ctx, store.Tenant{ID: "t2", Name: "one", CreatedAt: now})
		if !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("duplicate tenant name: got %v, want ErrAlreadyExists", err)
		}
		if _, err := s.GetTenant(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("missing tenant: got %v", err)
		}
		k := store.Key{ID: "k1", Tenant: "t1", SecretHash: []byte{1, 2, 3}, Admin: true, CreatedAt: now}
		if err := s.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetKey(ctx, "k1")
		if err != nil || string(got.SecretHash) != string(k.SecretHash) || !got.Admin || got.Tenant != "t1" {
			t.Fatalf("GetKey = %+v, %v", got, err)
		}
		if err := s.CreateKey(ctx, store.Key{ID: "k2", Tenant: "ghost", SecretHash: []byte{1}, CreatedAt: now}); err == nil {
			t.Fatal("key for a missing tenant was accepted")
		}
		keys, err := s.ListKeys(ctx, "t1")
		if err != nil || len(keys) != 1 {
			t.Fatalf("ListKeys = %v, %v", keys, err)
		}
		if err := s.DeleteKey(ctx, "k1"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteKey(ctx, "k1"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
	})

	t.Run("layers: tenant scoping and public layers", func(t *testing.T) {
		s := open(t)
		put := func(l store.Layer) {
			t.Helper()
			l.CreatedAt = now
			if err := s.PutLayer(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
		put(store.Layer{Tenant: "sys", Name: "base", Tag: "1", Digest: "sha256:aa", Kind: "base", Public: true})
		put(store.Layer{Tenant: "a", Name: "ws", Tag: "1", Digest: "sha256:bb", Kind: "workspace"})
		put(store.Layer{Tenant: "a", Name: "base", Tag: "1", Digest: "sha256:cc", Kind: "base"})

		for _, tc := range []struct {
			tenant, name, digest string
			err                  error
		}{
			{"a", "base", "sha256:cc", nil}, // own layer shadows the public one
			{"b", "base", "sha256:aa", nil}, // public
			{"a", "ws", "sha256:bb", nil},
			{"b", "ws", "", errdefs.ErrNotFound}, // another tenant's
		} {
			t.Run(tc.tenant+"/"+tc.name, func(t *testing.T) {
				l, err := s.GetLayer(ctx, tc.tenant, tc.name, "1")
				if !errors.Is(err, tc.err) || (err == nil && l.Digest != tc.digest) {
					t.Fatalf("GetLayer = %+v, %v; want %s, %v", l, err, tc.digest, tc.err)
				}
			})
		}
		if _, err := s.LayerByDigest(ctx, "b", "sha256:bb"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("digest of another tenant's layer: %v", err)
		}
		if l, err := s.LayerByDigest(ctx, "b", "sha256:aa"); err != nil || !l.Public {
			t.Fatalf("public digest: %+v %v", l, err)
		}
		ls, err := s.ListLayers(ctx, "b")
		if err != nil || len(ls) != 1 {
			t.Fatalf("ListLayers(b) = %v, %v", ls, err)
		}
		put(store.Layer{Tenant: "a", Name: "snap", Tag: "1", Digest: "sha256:ee", Kind: "snapshot", Parents: []string{"sha256:aa", "sha256:bb"}})
		if l, err := s.GetLayer(ctx, "a", "snap", "1"); err != nil || len(l.Parents) != 2 || l.Parents[1] != "sha256:bb" {
			t.Fatalf("snapshot parents: %+v %v", l, err)
		}
		put(store.Layer{Tenant: "a", Name: "ws", Tag: "1", Digest: "sha256:dd", Kind: "workspace"})
		if l, _ := s.GetLayer(ctx, "a", "ws", "1"); l.Digest != "sha256:dd" {
			t.Fatalf("retag did not move: %+v", l)
		}
	})

	t.Run("sandboxes: crud, filters, paging", func(t *testing.T) {
		s := open(t)
		exp := now.Add(time.Minute)
		for i := range 25 {
			sb := store.Sandbox{
				API: api.Sandbox{
					ID: fmt.Sprintf("sb-%02d", i), State: api.StateRunning, Node: "n1",
					Labels: map[string]string{"job": fmt.Sprint(i % 2)}, CreatedAt: now,
					Backend: []string{api.BackendContainer, api.BackendContainer, api.BackendMicroVM}[i%3],
				},
				Tenant:       []string{"a", "b"}[i%2],
				LayerDigests: []string{"sha256:aa"},
			}
			if i < 3 {
				sb.API.ExpiresAt = &exp
			}
			if err := s.CreateSandbox(ctx, &sb); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CreateSandbox(ctx, &store.Sandbox{API: api.Sandbox{ID: "sb-00"}}); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("duplicate id: %v", err)
		}
		got, err := s.GetSandbox(ctx, "sb-04")
		if err != nil || got.Tenant != "a" || got.API.Labels["job"] != "0" || got.LayerDigests[0] != "sha256:aa" {
			t.Fatalf("GetSandbox = %+v, %v", got, err)
		}
		var all []string
		tok := ""
		for {
			page, next, err := s.ListSandboxes(ctx, store.SandboxFilter{Tenant: "a", Limit: 5, PageToken: tok})
			if err != nil {
				t.Fatal(err)
			}
			for _, sb := range page {
				all = append(all, sb.API.ID)
			}
			if next == "" {
				break
			}
			tok = next
		}
		if len(all) != 13 {
			t.Fatalf("paged list of tenant a: %d items %v", len(all), all)
		}
		byLabel, _, err := s.ListSandboxes(ctx, store.SandboxFilter{AllTenants: true, Labels: map[string]string{"job": "1"}})
		if err != nil || len(byLabel) != 12 {
			t.Fatalf("label filter: %d, %v", len(byLabel), err)
		}
		later := now.Add(2 * time.Minute)
		expired, _, err := s.ListSandboxes(ctx, store.SandboxFilter{AllTenants: true, ExpiredBy: &later})
		if err != nil || len(expired) != 3 {
			t.Fatalf("expired filter: %d, %v", len(expired), err)
		}
		stale := got
		got.API.State = api.StateDeleted
		got.DeletedAt = &now
		if err := s.UpdateSandbox(ctx, &got); err != nil {
			t.Fatal(err)
		}
		stale.API.State = api.StatePaused
		if err := s.UpdateSandbox(ctx, &stale); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("update from a stale read: got %v, want ErrConflict", err)
		}
		active := now.Add(time.Hour)
		if err := s.TouchSandbox(ctx, "sb-04", active); err != nil {
			t.Fatal(err)
		}
		if again, _ := s.GetSandbox(ctx, "sb-04"); !again.LastActive.Equal(active) || again.API.State != api.StateDeleted {
			t.Fatalf("after touch: %+v", again)
		}
		running, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{Tenant: "a", States: []string{api.StateRunning}})
		if len(running) != 12 {
			t.Fatalf("state filter: %d", len(running))
		}
		// Tenant a holds sb-00..sb-24 even: 13, sb-04 deleted; every third
		// (i%3 == 2: 2, 8, 14, 20) is a microVM.
		vms, _, err := s.ListSandboxes(ctx, store.SandboxFilter{Tenant: "a", Backend: api.BackendMicroVM})
		if err != nil || len(vms) != 4 {
			t.Fatalf("backend filter: %d, %v", len(vms), err)
		}
		onLayer, _, err := s.ListSandboxes(ctx, store.SandboxFilter{Tenant: "a", Layer: "sha256:aa", States: []string{api.StateRunning}})
		if err != nil || len(onLayer) != 12 {
			t.Fatalf("layer filter: %d, %v", len(onLayer), err)
		}
		if none, _, err := s.ListSandboxes(ctx, store.SandboxFilter{Tenant: "a", Layer: "sha256:bb"}); err != nil || len(none) != 0 {
			t.Fatalf("layer filter, a layer nobody runs: %d, %v", len(none), err)
		}
		count := func(tenant string) map[string]int64 {
			t.Helper()
			list, err := s.CountSandboxes(ctx, tenant)
			if err != nil {
				t.Fatal(err)
			}
			m := map[string]int64{}
			for _, c := range list {
				m[c.State+"/"+c.Backend] += c.Count
			}
			return m
		}
		if got, want := count("a"), map[string]int64{"running/container": 8, "running/microvm": 4, "deleted/container": 1}; !maps.Equal(got, want) {
			t.Fatalf("counts of tenant a: %v, want %v", got, want)
		}
		if got := count(""); got["running/container"]+got["running/microvm"] != 24 {
			t.Fatalf("counts of every tenant: %v", got)
		}
		if err := s.UpdateSandbox(ctx, &store.Sandbox{API: api.Sandbox{ID: "ghost"}}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("update of a missing sandbox: %v", err)
		}
		n, err := s.PurgeSandboxes(ctx, now.Add(time.Second))
		if err != nil || n != 1 {
			t.Fatalf("purge = %d, %v", n, err)
		}
		if _, err := s.GetSandbox(ctx, "sb-04"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("purged sandbox still there: %v", err)
		}
	})

	t.Run("sandboxes: bulk insert is all or nothing", func(t *testing.T) {
		s := open(t)
		exp := now.Add(time.Hour)
		var list []*store.Sandbox
		for i := range 500 {
			list = append(list, &store.Sandbox{
				API: api.Sandbox{
					ID: fmt.Sprintf("sb-bulk-%03d", i), State: api.StateCreating, Node: "n1",
					Labels: map[string]string{api.LabelBatch: "b1"}, CreatedAt: now, ExpiresAt: &exp,
				},
				Tenant: "a", LastActive: now,
			})
		}
		if err := s.CreateSandboxes(ctx, list); err != nil {
			t.Fatal(err)
		}
		for _, sb := range list {
			if sb.Version != 1 {
				t.Fatalf("%s: Version %d after bulk insert, want 1", sb.API.ID, sb.Version)
			}
		}
		got, _, err := s.ListSandboxes(ctx, store.SandboxFilter{Tenant: "a", Labels: map[string]string{api.LabelBatch: "b1"}})
		if err != nil || len(got) != 500 {
			t.Fatalf("batch listed by label: %d, %v", len(got), err)
		}
		// An update through the single-record path works on a bulk record.
		one := got[7]
		one.API.State = api.StateRunning
		if err := s.UpdateSandbox(ctx, &one); err != nil {
			t.Fatalf("update a bulk-inserted record: %v", err)
		}
		dup := []*store.Sandbox{
			{API: api.Sandbox{ID: "sb-bulk-new-1", State: api.StateCreating}, Tenant: "a"},
			{API: api.Sandbox{ID: "sb-bulk-010", State: api.StateCreating}, Tenant: "a"},
		}
		if err := s.CreateSandboxes(ctx, dup); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("bulk insert with a duplicate id: %v, want ErrAlreadyExists", err)
		}
		if _, err := s.GetSandbox(ctx, "sb-bulk-new-1"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("a failed bulk insert left a record behind: %v", err)
		}
		if err := s.CreateSandboxes(ctx, nil); err != nil {
			t.Fatalf("empty bulk insert: %v", err)
		}
	})

	runCluster(t, open)

	t.Run("sandboxes: idle filter and generation", func(t *testing.T) { idle(t, open(t)) })
	t.Run("trajectory steps", func(t *testing.T) { steps(t, open(t), reopen) })
	t.Run("trajectory settings and checkpoints", func(t *testing.T) { checkpoints(t, open(t)) })
	t.Run("layers: delete and in use", func(t *testing.T) { layersInUse(t, open(t)) })
	t.Run("layers: unused fork and build-cache layers", func(t *testing.T) { unusedLayers(t, open(t)) })

	t.Run("durable across reopen", func(t *testing.T) {
		s := open(t)
		if err := s.CreateTenant(ctx, store.Tenant{ID: "t9", Name: "nine", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateSandbox(ctx, &store.Sandbox{API: api.Sandbox{ID: "sb-x", State: api.StateRunning}, Tenant: "t9"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s2 := reopen(t)
		if _, err := s2.GetTenant(ctx, "t9"); err != nil {
			t.Fatalf("tenant lost across reopen: %v", err)
		}
		if sb, err := s2.GetSandbox(ctx, "sb-x"); err != nil || sb.Tenant != "t9" {
			t.Fatalf("sandbox lost across reopen: %+v %v", sb, err)
		}
	})
}
