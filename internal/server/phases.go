package server

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/policy"
)

// DefaultProfiles are the profiles every server offers. "swe" is the
// shape of a software-engineering episode: set the environment up with the
// network open, let the agent work with the network closed and /eval out
// of its reach, then evaluate with everything readable and no network.
func DefaultProfiles() map[string]api.Profile {
	return map[string]api.Profile{
		"swe": {
			Phase: "setup",
			Phases: map[string]api.Phase{
				"setup": {Network: &api.Network{Mode: api.NetworkOpen}},
				"agent": {Network: &api.Network{Mode: api.NetworkNone}, Files: &api.FileRules{Deny: []string{"/eval"}}},
				"eval":  {Network: &api.Network{Mode: api.NetworkNone}},
			},
		},
	}
}

// resolveProfile replaces a profile reference by its phases; the request's
// own phase, if set, overrides the profile's first phase.
func (s *Server) resolveProfile(req *api.CreateSandboxRequest) error {
	if req.Profile == "" {
		return nil
	}
	if len(req.Phases) > 0 {
		return errdefs.Invalid("set one of profile and phases, not both")
	}
	p, ok := s.cfg.Profiles[req.Profile]
	if !ok {
		return errdefs.Invalid("unknown profile %q (GET /v1/profiles lists them)", req.Profile)
	}
	req.Phases = p.Phases
	if req.Phase == "" {
		req.Phase = p.Phase
	}
	return nil
}

func (s *Server) listProfiles(w http.ResponseWriter, r *http.Request) error {
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"profiles": s.cfg.Profiles})
	return nil
}

// setPhase switches a running sandbox to another of its phases. When it
// answers, every command started afterwards runs under the new phase.
func (s *Server) setPhase(w http.ResponseWriter, r *http.Request) error {
	var req api.SetPhaseRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	sb, n, err := s.liveSandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if len(sb.API.Phases) == 0 {
		return errdefs.Invalid("sandbox %s has no phases", sb.API.ID)
	}
	if _, ok := sb.API.Phases[req.Phase]; !ok {
		return errdefs.Invalid("phase %q is not one of sandbox %s's phases", req.Phase, sb.API.ID)
	}
	ctx := context.WithoutCancel(r.Context()) // once started, see it through
	net, files := policy.Effective(sb.API.Network, sb.API.Phases, req.Phase)
	if err := n.client.SetPhase(ctx, sb.API.ID, edge.PhaseRequest{Phase: req.Phase, Network: net, Files: files}); err != nil {
		return fmt.Errorf("set phase of %s: %w", sb.API.ID, err)
	}
	sb.API.Phase = req.Phase
	sb.LastActive = time.Now().UTC()
	if err := s.store.UpdateSandbox(ctx, &sb); err != nil {
		return err
	}
	s.log.InfoContext(ctx, "phase", "sandbox", sb.API.ID, "phase", req.Phase)
	httpapi.WriteJSON(w, http.StatusOK, sb.API)
	return nil
}
