package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/store"
)

// activeEvery throttles writes of a sandbox's last-active time to the
// store; the exact time is kept in memory.
const activeEvery = 30 * time.Second

// liveStates are the states of a sandbox that holds resources on a node.
var liveStates = []string{api.StateCreating, api.StateRunning, api.StatePaused, api.StateLost}

// activity is what this server knows of sandboxes' use beyond the store:
// the exact time of the last call on each, and the calls in flight. A
// sandbox with a call in flight (a long exec, a followed output) is never
// idle.
type activity struct {
	mu      sync.Mutex
	last    map[string]time.Time // last activity
	written map[string]time.Time // last activity written to the store
	busy    map[string]int       // calls in flight
}

func newActivity() *activity {
	return &activity{last: map[string]time.Time{}, written: map[string]time.Time{}, busy: map[string]int{}}
}

// begin records the start of a call on sb; the returned func records its
// end. Both count as activity.
func (s *Server) begin(ctx context.Context, sb store.Sandbox) (end func()) {
	a := s.acts
	a.mu.Lock()
	a.busy[sb.API.ID]++
	a.mu.Unlock()
	s.touch(ctx, sb)
	return func() {
		a.mu.Lock()
		if a.busy[sb.API.ID]--; a.busy[sb.API.ID] <= 0 {
			delete(a.busy, sb.API.ID)
		}
		a.mu.Unlock()
		s.touch(ctx, sb)
	}
}

// touch records activity on a sandbox now, writing it to the store at
// most every activeEvery.
func (s *Server) touch(ctx context.Context, sb store.Sandbox) {
	now := time.Now().UTC()
	a := s.acts
	a.mu.Lock()
	a.last[sb.API.ID] = now
	w, ok := a.written[sb.API.ID]
	if !ok || w.Before(sb.LastActive) {
		w = sb.LastActive
	}
	if now.Sub(w) < activeEvery {
		a.mu.Unlock()
		return
	}
	a.written[sb.API.ID] = now
	a.mu.Unlock()
	if err := s.store.TouchSandbox(context.WithoutCancel(ctx), sb.API.ID, now); err != nil {
		s.log.WarnContext(ctx, "record activity", "sandbox", sb.API.ID, "err", err)
	}
}

// touchBusy writes the activity of sandboxes with calls in flight, so the
// store (other replicas, a restarted server) sees them as active too.
func (s *Server) touchBusy(ctx context.Context) {
	a := s.acts
	now := time.Now().UTC()
	var ids []string
	a.mu.Lock()
	for id := range a.busy {
		if now.Sub(a.written[id]) >= activeEvery {
			a.last[id], a.written[id] = now, now
			ids = append(ids, id)
		}
	}
	a.mu.Unlock()
	for _, id := range ids {
		if err := s.store.TouchSandbox(ctx, id, now); err != nil {
			s.log.WarnContext(ctx, "record activity", "sandbox", id, "err", err)
		}
	}
}

// lastActive is the latest activity known for sb, here or in the store.
func (s *Server) lastActive(sb store.Sandbox) (time.Time, bool) {
	s.acts.mu.Lock()
	defer s.acts.mu.Unlock()
	last := sb.LastActive
	if t := s.acts.last[sb.API.ID]; t.After(last) {
		last = t
	}
	return last, s.acts.busy[sb.API.ID] > 0
}

func (s *Server) forget(id string) {
	s.acts.mu.Lock()
	delete(s.acts.last, id)
	delete(s.acts.written, id)
	s.acts.mu.Unlock()
}

// view is the API form of a record, with the latest activity.
func (s *Server) view(sb store.Sandbox) api.Sandbox {
	v := sb.API
	if last, _ := s.lastActive(sb); !last.IsZero() {
		v.LastActiveAt = &last
	}
	return v
}

// renewSandbox moves a sandbox's lease end to now + ttl.
func (s *Server) renewSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.RenewRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil && !errors.Is(err, httpapi.ErrEmptyBody) {
		return err
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > int64(s.cfg.MaxTTL/time.Second) {
		return errdefs.Invalid("ttl_seconds must be between 0 and %d", int64(s.cfg.MaxTTL/time.Second))
	}
	ctx := r.Context()
	for range 8 {
		sb, err := s.sandboxFor(ctx, r.PathValue("id"))
		if err != nil {
			return err
		}
		switch sb.API.State {
		case api.StateCreating, api.StateRunning, api.StatePaused:
		case api.StateDeleted, api.StateFailed:
			return errdefs.NotFound("sandbox %s is %s", sb.API.ID, sb.API.State)
		default:
			return fmt.Errorf("sandbox %s is %s: %w", sb.API.ID, sb.API.State, errdefs.ErrFailedPrecondition)
		}
		ttl := time.Duration(req.TTLSeconds) * time.Second
		if ttl == 0 {
			ttl = time.Duration(sb.API.TTLSeconds) * time.Second
		}
		if ttl == 0 {
			ttl = s.cfg.DefaultTTL // a record from before leases were renewable
		}
		now := time.Now().UTC()
		exp := now.Add(ttl)
		sb.API.ExpiresAt, sb.LastActive = &exp, now
		err = s.store.UpdateSandbox(ctx, &sb)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return err
		}
		s.acts.mu.Lock()
		s.acts.last[sb.API.ID], s.acts.written[sb.API.ID] = now, now
		s.acts.mu.Unlock()
		httpapi.WriteJSON(w, http.StatusOK, s.view(sb))
		return nil
	}
	return fmt.Errorf("renew sandbox %s: %w", r.PathValue("id"), store.ErrConflict)
}

// reap destroys the sandboxes whose lease ended and those idle for longer
// than their idle timeout.
func (s *Server) reap(ctx context.Context) {
	now := time.Now().UTC()
	for _, f := range []store.SandboxFilter{
		{AllTenants: true, ExpiredBy: &now, States: liveStates, Limit: 1000},
		{AllTenants: true, IdleBy: &now, States: liveStates, Limit: 1000},
	} {
		list, _, err := s.store.ListSandboxes(ctx, f)
		if err != nil {
			s.log.WarnContext(ctx, "reap: list sandboxes", "err", err)
			return
		}
		for _, sb := range list {
			if s.reapReason(sb, now) != "" {
				s.reapOne(ctx, sb.API.ID)
			}
		}
	}
}

// reapReason says why sb should be destroyed now, or "" if it should not.
func (s *Server) reapReason(sb store.Sandbox, now time.Time) string {
	if sb.DeletedAt != nil || sb.API.State == api.StateDeleted || sb.API.State == api.StateFailed {
		return ""
	}
	if sb.API.State == api.StateCreating && now.Sub(sb.API.CreatedAt) < createTimeoutFor(sb.API.Backend) {
		return "" // its create is still in flight
	}
	if sb.API.ExpiresAt != nil && !sb.API.ExpiresAt.After(now) {
		return "reaped: its lease ended at " + sb.API.ExpiresAt.Format(time.RFC3339)
	}
	if idle := time.Duration(sb.API.IdleTimeoutSeconds) * time.Second; idle > 0 {
		last, busy := s.lastActive(sb)
		if !busy && now.Sub(last) >= idle {
			return fmt.Sprintf("reaped: idle since %s (idle timeout %s)", last.Format(time.RFC3339), idle)
		}
	}
	return ""
}

// reapOne destroys a sandbox if, read again, it is still due: a renew
// that came in between wins.
func (s *Server) reapOne(ctx context.Context, id string) {
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return
	}
	why := s.reapReason(sb, time.Now().UTC())
	if why == "" {
		return
	}
	sb.API.Error = why
	if err := s.destroy(ctx, sb); err != nil {
		s.log.WarnContext(ctx, "reap: destroy sandbox", "sandbox", id, "err", err)
		return
	}
	s.log.InfoContext(ctx, "reaped sandbox", "sandbox", id, "tenant", sb.Tenant, "reason", why)
}
