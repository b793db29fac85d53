package server_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsec-project/dsec/internal/server"
)

// An admin key the operator wrote before the first start (a Kubernetes
// Secret mounted on every replica) is adopted, not replaced: every replica
// and every restart answers to the same key.
func TestBootstrapAdoptsOperatorKey(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	keyPath := filepath.Join(t.TempDir(), "admin.key")
	const key = "dsec_operatorkey_0123456789abcdefghijklmnop"
	if err := os.WriteFile(keyPath, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // first start adopts, a restart (another replica) finds it
		got, err := server.Bootstrap(ctx, st, keyPath)
		if err != nil {
			t.Fatal(err)
		}
		if got != key {
			t.Fatalf("start %d: bootstrap answered %q, want the operator's key", i, got)
		}
	}
	k, err := st.GetKey(ctx, "operatorkey")
	if err != nil || !k.Admin || k.Tenant != server.AdminTenant {
		t.Fatalf("adopted key: %+v, %v", k, err)
	}

	// A malformed file is replaced by a fresh key, as before.
	if err := os.WriteFile(keyPath, []byte("not-a-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := server.Bootstrap(ctx, st, keyPath)
	if err != nil || got == "not-a-key" || got == key {
		t.Fatalf("malformed key file: got %q, %v", got, err)
	}
}
