package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// An API key reads dsec_<key id>_<secret>. The id finds the record; only
// the SHA-256 of the secret is stored (secrets are 160 random bits, so a
// slow hash would buy nothing).
const keyPrefix = "dsec_"

// AdminTenant is the tenant that holds the first admin key and the public
// layers made by the server itself.
const AdminTenant = "t-admin"

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

func randomID(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return strings.ToLower(b32.EncodeToString(b))
}

func hashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// newKey makes a key record and its plaintext.
func newKey(tenant string, admin bool) (store.Key, string) {
	id, secret := randomID(8), randomID(20)
	return store.Key{
		ID: id, Tenant: tenant, SecretHash: hashSecret(secret), Admin: admin,
		CreatedAt: time.Now().UTC(),
	}, keyPrefix + id + "_" + secret
}

// principal is who made a request.
type principal struct {
	Tenant string
	Admin  bool
	KeyID  string
}

type principalKey struct{}

func principalFrom(ctx context.Context) principal {
	p, _ := ctx.Value(principalKey{}).(principal)
	return p
}

// authenticator checks API keys, caching good ones briefly so that a burst
// of requests does not hit the database for each.
type authenticator struct {
	store store.TenantStore
	ttl   time.Duration

	mu    sync.Mutex
	cache map[string]cachedKey // by full key string
}

type cachedKey struct {
	p       principal
	expires time.Time
}

func (a *authenticator) authenticate(r *http.Request) (principal, error) {
	h := r.Header.Get("Authorization")
	key, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || key == "" {
		return principal{}, fmt.Errorf("missing API key (Authorization: Bearer <key>): %w", errdefs.ErrUnauthenticated)
	}
	return a.authenticateKey(r.Context(), key)
}

// authenticateKey checks a key however it came (the client-compatibility
// surfaces take it from their own headers or paths).
func (a *authenticator) authenticateKey(ctx context.Context, key string) (principal, error) {
	now := time.Now()
	a.mu.Lock()
	c, hit := a.cache[key]
	a.mu.Unlock()
	if hit && now.Before(c.expires) {
		return c.p, nil
	}
	rest, ok := strings.CutPrefix(key, keyPrefix)
	id, secret, ok2 := strings.Cut(rest, "_")
	if !ok || !ok2 {
		return principal{}, fmt.Errorf("malformed API key: %w", errdefs.ErrUnauthenticated)
	}
	k, err := a.store.GetKey(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return principal{}, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return principal{}, err
	}
	if subtle.ConstantTimeCompare(k.SecretHash, hashSecret(secret)) != 1 {
		return principal{}, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	p := principal{Tenant: k.Tenant, Admin: k.Admin, KeyID: k.ID}
	a.mu.Lock()
	if len(a.cache) > 10000 {
		clear(a.cache)
	}
	a.cache[key] = cachedKey{p: p, expires: now.Add(a.ttl)}
	a.mu.Unlock()
	return p, nil
}

// forget drops cached entries of a revoked key.
func (a *authenticator) forget(keyID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, c := range a.cache {
		if c.p.KeyID == keyID {
			delete(a.cache, k)
		}
	}
}

// Bootstrap makes sure the admin tenant exists and that keyPath holds a
// working admin key, creating both on first start. It returns the key.
func Bootstrap(ctx context.Context, st store.TenantStore, keyPath string) (string, error) {
	if _, err := st.GetTenant(ctx, AdminTenant); errors.Is(err, errdefs.ErrNotFound) {
		err := st.CreateTenant(ctx, store.Tenant{ID: AdminTenant, Name: "admin", CreatedAt: time.Now().UTC()})
		if err != nil && !errors.Is(err, errdefs.ErrAlreadyExists) {
			return "", fmt.Errorf("bootstrap: %w", err)
		}
	} else if err != nil {
		return "", fmt.Errorf("bootstrap: %w", err)
	}
	if b, err := os.ReadFile(keyPath); err == nil {
		key := strings.TrimSpace(string(b))
		if id, secret, ok := strings.Cut(strings.TrimPrefix(key, keyPrefix), "_"); ok && strings.HasPrefix(key, keyPrefix) {
			k, err := st.GetKey(ctx, id)
			if errors.Is(err, errdefs.ErrNotFound) && id != "" && len(secret) >= 16 {
				// A key the operator made (a Kubernetes Secret mounted on
				// every replica): adopt it, so all replicas share one admin
				// key and a restart does not mint another.
				k = store.Key{ID: id, Tenant: AdminTenant, SecretHash: hashSecret(secret), Admin: true, CreatedAt: time.Now().UTC()}
				if err = st.CreateKey(ctx, k); errors.Is(err, errdefs.ErrAlreadyExists) {
					k, err = st.GetKey(ctx, id)
				}
			}
			if err == nil && k.Admin && subtle.ConstantTimeCompare(k.SecretHash, hashSecret(secret)) == 1 {
				return key, nil
			}
		}
	}
	k, plain := newKey(AdminTenant, true)
	if err := st.CreateKey(ctx, k); err != nil {
		return "", fmt.Errorf("bootstrap: %w", err)
	}
	tmp := keyPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(plain+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("bootstrap: write admin key: %w", err)
	}
	if err := os.Rename(tmp, keyPath); err != nil {
		return "", fmt.Errorf("bootstrap: write admin key: %w", err)
	}
	return plain, nil
}
