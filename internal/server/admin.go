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
