package server

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/store"
)

var tenantNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

func tenantAPI(t store.Tenant) api.Tenant {
	return api.Tenant{ID: t.ID, Name: t.Name, CreatedAt: t.CreatedAt}
}

func keyAPI(k store.Key) api.APIKey {
	return api.APIKey{ID: k.ID, Tenant: k.Tenant, Admin: k.Admin, CreatedAt: k.CreatedAt}
}

func (s *Server) createTenant(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateTenantRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if !tenantNameRE.MatchString(req.Name) {
		return errdefs.Invalid("tenant name %q: want [a-z0-9_-], up to 63 chars", req.Name)
	}
	t := store.Tenant{ID: "t-" + randomID(8), Name: req.Name, CreatedAt: time.Now().UTC()}
	if err := s.store.CreateTenant(r.Context(), t); err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusCreated, tenantAPI(t))
	return nil
}

func (s *Server) listTenants(w http.ResponseWriter, r *http.Request) error {
	ts, err := s.store.ListTenants(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.Tenant, 0, len(ts))
	for _, t := range ts {
		out = append(out, tenantAPI(t))
	}
	httpapi.WriteJSON(w, http.StatusOK, api.TenantList{Tenants: out})
	return nil
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateKeyRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil && !errors.Is(err, httpapi.ErrEmptyBody) {
		return err
	}
	tenant := r.PathValue("id")
	if _, err := s.store.GetTenant(r.Context(), tenant); err != nil {
		return err
	}
	k, plain := newKey(tenant, req.Admin)
	if err := s.store.CreateKey(r.Context(), k); err != nil {
		return err
	}
	out := keyAPI(k)
	out.Secret = plain
	httpapi.WriteJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.store.GetTenant(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	ks, err := s.store.ListKeys(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	out := make([]api.APIKey, 0, len(ks))
	for _, k := range ks {
		out = append(out, keyAPI(k))
	}
	httpapi.WriteJSON(w, http.StatusOK, api.KeyList{Keys: out})
	return nil
}

func (s *Server) deleteKey(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if id == principalFrom(r.Context()).KeyID {
		return fmt.Errorf("a key cannot revoke itself: %w", errdefs.ErrFailedPrecondition)
	}
	if err := s.store.DeleteKey(r.Context(), id); err != nil {
		return err
	}
	s.auth.forget(id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// tenantWithUsage is a tenant with its quota and usage.
func (s *Server) tenantWithUsage(r *http.Request, t store.Tenant) (api.Tenant, error) {
	out := tenantAPI(t)
	u, err := s.store.Usage(r.Context(), t.ID)
	if err != nil {
		return out, err
	}
	q := api.Quota{Sandboxes: u.Quota.Sandboxes, CPU: u.Quota.CPU, MemoryMB: u.Quota.MemoryMB}
	out.Quota = &q
	out.Usage = &api.Usage{Sandboxes: u.Sandboxes, CPU: u.CPU, MemoryMB: u.MemoryMB}
	return out, nil
}

func (s *Server) getTenant(w http.ResponseWriter, r *http.Request) error {
	t, err := s.store.GetTenant(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	out, err := s.tenantWithUsage(r, t)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// setQuota replaces a tenant's quota. Sandboxes already running over a
// lowered quota keep running; new ones are refused until usage drops.
func (s *Server) setQuota(w http.ResponseWriter, r *http.Request) error {
	var q api.Quota
	if err := httpapi.DecodeJSON(r, &q); err != nil {
		return err
	}
	if q.Sandboxes < 0 || q.CPU < 0 || q.MemoryMB < 0 {
		return errdefs.Invalid("quota fields must not be negative (0 is unlimited)")
	}
	t, err := s.store.GetTenant(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := s.store.SetQuota(r.Context(), t.ID, store.Quota{Sandboxes: q.Sandboxes, CPU: q.CPU, MemoryMB: q.MemoryMB}); err != nil {
		return err
	}
	out, err := s.tenantWithUsage(r, t)
	if err != nil {
		return err
	}
	s.log.InfoContext(r.Context(), "tenant quota set", "tenant", t.ID, "sandboxes", q.Sandboxes, "cpu", q.CPU, "memory_mb", q.MemoryMB)
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
