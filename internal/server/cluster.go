package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/store"
)

var nodeIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// heartbeat serves POST /v1/cluster/heartbeat: nodes join and report
// with the cluster token.
func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if s.cfg.ClusterToken == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(s.cfg.ClusterToken)) != 1 {
		httpapi.WriteError(w, r, fmt.Errorf("bad or missing cluster token: %w", errdefs.ErrUnauthenticated))
		return
	}
	var hb edge.Heartbeat
	if err := httpapi.DecodeJSON(r, &hb); err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	reply, err := s.Heartbeat(r.Context(), hb)
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, reply)
}

// Heartbeat records a node's report. A node this replica has no
// connection to (a new node, a new address or token, a restarted control
// plane) is called back at its address first, to check it is reachable
// and is who it claims to be; then its sandbox records are reconciled
// with what it runs. A node that was down comes back up, and its lost
// sandboxes are reconciled too. It implements edge.ControlPlane, so the
// all-in-one server's own node reports in-process.
func (s *Server) Heartbeat(ctx context.Context, hb edge.Heartbeat) (edge.HeartbeatReply, error) {
	return s.beat(ctx, hb, false)
}

// JoinLocal registers the node that runs in this process (the
// all-in-one's) as its first heartbeat would, but reconciles it before
// returning, and settles every creating record on it: no other process can
// reach that node, so a create recorded there and not finished died with
// the previous server.
func (s *Server) JoinLocal(ctx context.Context, hb edge.Heartbeat) error {
	_, err := s.beat(ctx, hb, true)
	return err
}

func (s *Server) beat(ctx context.Context, hb edge.Heartbeat, local bool) (edge.HeartbeatReply, error) {
	if !nodeIDRE.MatchString(hb.ID) {
		return edge.HeartbeatReply{}, errdefs.Invalid("node id %q: want [A-Za-z0-9._-], up to 63 chars", hb.ID)
	}
	if hb.Capacity.CPU <= 0 || hb.Capacity.MemoryMB <= 0 {
		return edge.HeartbeatReply{}, errdefs.Invalid("node %s: capacity needs cpu and memory_mb", hb.ID)
	}
	if err := edge.CheckProtocol(hb); err != nil {
		if last, ok := s.refusedAt.Load(hb.ID); !ok || time.Since(last.(time.Time)) > time.Minute {
			s.refusedAt.Store(hb.ID, time.Now())
			s.log.ErrorContext(ctx, "refusing a node whose edge protocol this control plane does not speak",
				"node", hb.ID, "addr", hb.Addr, "build", hb.Version, "protocol", hb.Protocol, "err", err)
		}
		return edge.HeartbeatReply{}, err
	}
	now := time.Now().UTC()
	stored, err := s.store.GetNode(ctx, hb.ID)
	known := err == nil
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return edge.HeartbeatReply{}, err
	}
	if known && stored.State == store.NodeUp && stored.Addr != hb.Addr && now.Sub(stored.LastSeen) < s.cfg.NodeTimeout {
		return edge.HeartbeatReply{}, fmt.Errorf("node %s is already up at %s (heard %s ago); a second node cannot take its id: %w",
			hb.ID, stored.Addr, now.Sub(stored.LastSeen).Round(time.Millisecond), errdefs.ErrAlreadyExists)
	}
	cur, connected := s.nodes.lookup(hb.ID)
	fresh := !connected || cur.addr != hb.Addr || cur.token != hb.Token
	if fresh {
		if cur, err = s.verify(ctx, hb); err != nil {
			return edge.HeartbeatReply{}, err
		}
	}
	rec := store.Node{
		ID: hb.ID, Addr: hb.Addr, Token: hb.Token, State: store.NodeUp, Capacity: hb.Capacity,
		Limit: s.limit(hb.Capacity), Backends: hb.Backends, Labels: hb.Labels, Load: hb.Load,
		Layers: hb.Layers, LastSeen: now, CreatedAt: now,
	}
	if known {
		rec.CreatedAt = stored.CreatedAt
	}
	if err := s.store.UpsertNode(ctx, rec); err != nil {
		return edge.HeartbeatReply{}, err
	}
	revived := false
	if known && stored.State == store.NodeDown {
		if revived, err = s.store.SetNodeState(ctx, hb.ID, []string{store.NodeDown}, store.NodeUp, time.Time{}); err != nil {
			return edge.HeartbeatReply{}, err
		}
		if revived {
			s.log.InfoContext(ctx, "node is back", "node", hb.ID, "addr", hb.Addr)
		}
	}
	// What the scheduler needs is rec with the stored allocation, state
	// and drain flag: no need to read the node back.
	n := rec
	if known {
		n.Drain, n.Allocated, n.Sandboxes = stored.Drain, stored.Allocated, stored.Sandboxes
		if rec.Layers == nil {
			n.Layers = stored.Layers
		}
		if stored.State == store.NodeDown && !revived {
			n.State = store.NodeDown
		}
	}
	s.sched.UpdateNode(schedState(n))
	s.admission.Kick() // its load may have fallen
	if fresh {
		s.nodes.put(cur, hb.Backends)
		s.log.InfoContext(ctx, "node connected", "node", hb.ID, "addr", hb.Addr, "cpu", hb.Capacity.CPU,
			"memory_mb", hb.Capacity.MemoryMB, "labels", hb.Labels, "build", hb.Version, "protocol", hb.Protocol)
	}
	if local {
		if err := s.reconcile(ctx, hb.ID, cur.client, true); err != nil {
			return edge.HeartbeatReply{}, err
		}
	} else if fresh || revived {
		// Reconciling waits for the node's list; the heartbeat need not.
		go func() {
			rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := s.reconcile(rctx, hb.ID, cur.client, false); err != nil {
				s.log.WarnContext(ctx, "reconcile failed", "node", hb.ID, "err", err)
			}
		}()
	}
	return edge.HeartbeatReply{State: nodeAPI(n).State, Version: edge.BuildVersion(), Protocol: edge.ProtocolVersion}, nil
}

// verify calls a node back at its advertised address with its token.
func (s *Server) verify(ctx context.Context, hb edge.Heartbeat) (*node, error) {
	n, err := s.connect(hb.ID, hb.Addr, hb.Token)
	if err != nil {
		return nil, err
	}
	vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := n.client.Info(vctx)
	if err != nil {
		n.cancel()
		return nil, fmt.Errorf("node %s: cannot reach its edge at %s: %v: %w", hb.ID, hb.Addr, err, errdefs.ErrUnavailable)
	}
	if info.ID != hb.ID {
		n.cancel()
		return nil, errdefs.Invalid("the edge at %s says it is node %q, not %q", hb.Addr, info.ID, hb.ID)
	}
	return n, nil
}

// limit is the most that may be charged to a node of capacity c.
func (s *Server) limit(c api.Resources) api.Resources {
	cfg := s.sched.Config()
	return api.Resources{CPU: c.CPU * cfg.CPUOvercommit, MemoryMB: c.MemoryMB, Pids: c.Pids,
		DiskMB: int64(float64(c.DiskMB) * cfg.DiskOvercommit)}
}

// syncNodes runs on every replica: it re-reads the nodes from the store
// (their load, and the allocation every replica's placements charged),
// connects to nodes other replicas registered, and declares down the
// nodes no replica heard from within NodeTimeout, marking their
// sandboxes lost.
func (s *Server) syncNodes(ctx context.Context, sweepLost bool) {
	nodes, err := s.store.ListNodes(ctx)
	if err != nil {
		s.log.WarnContext(ctx, "sync nodes", "err", err)
		return
	}
	now := time.Now().UTC()
	for _, n := range nodes {
		// A node reached over a unix socket runs in this process (the
		// all-in-one's): it lives as long as the server does, and a
		// heartbeat late because the host is swamped must not lose it.
		inProcess := strings.HasPrefix(n.Addr, "unix://")
		if n.State == store.NodeUp && !inProcess && now.Sub(n.LastSeen) > s.cfg.NodeTimeout {
			changed, err := s.store.SetNodeState(ctx, n.ID, []string{store.NodeUp}, store.NodeDown, now.Add(-s.cfg.NodeTimeout))
			if err != nil {
				s.log.WarnContext(ctx, "mark node down", "node", n.ID, "err", err)
				continue
			}
			if changed {
				n.State = store.NodeDown
				s.nodeDown(ctx, n)
			}
		}
		if n.State == store.NodeDown {
			s.nodes.cut(n.ID)
			if sweepLost {
				// The replica that declared it down may have died
				// before marking its sandboxes.
				if c, err := s.store.MarkSandboxesLost(ctx, n.ID); err == nil && c > 0 {
					s.log.WarnContext(ctx, "marked sandboxes of a down node lost", "node", n.ID, "count", c)
				}
			}
		} else if _, ok := s.nodes.lookup(n.ID); !ok && n.Addr != "" {
			if c, err := s.connect(n.ID, n.Addr, n.Token); err == nil {
				s.nodes.put(c, n.Backends)
			}
		}
		s.sched.SetNode(schedState(n))
	}
	s.admission.Kick()
}

// nodeDown acts once on a node that stopped heartbeating.
func (s *Server) nodeDown(ctx context.Context, n store.Node) {
	s.nodes.cut(n.ID)
	lost, err := s.store.MarkSandboxesLost(ctx, n.ID)
	if err != nil {
		s.log.ErrorContext(ctx, "mark sandboxes lost", "node", n.ID, "err", err)
	}
	s.log.WarnContext(ctx, "node stopped heartbeating: down, its sandboxes lost", "node", n.ID,
		"last_seen", n.LastSeen, "lost", lost)
}

// runNodeSync syncs nodes every SyncInterval until ctx ends.
func (s *Server) runNodeSync(ctx context.Context) {
	tick := time.NewTicker(s.cfg.SyncInterval)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.syncNodes(ctx, i%10 == 0)
	}
}

// reconcile makes the records of a node's sandboxes agree with what the
// node runs: live records of sandboxes the node lost become failed, lost
// and in-flight ones the node has become running, and sandboxes the node
// runs without a live record are destroyed. Unless all is set, creates
// younger than createTimeout are left alone: another request (or replica)
// may be placing them right now.
//
// The records are read before the node's list: a record running by then
// was created on the node before the list was taken, so missing from it
// means lost. (Read the other way round, a create finishing between the
// two reads looked missing, and its sandbox was failed.) A sandbox the
// node lists without a record read here is looked up again before it is
// destroyed: its create may have started after the records were read.
func (s *Server) reconcile(ctx context.Context, nodeID string, c *edge.Client, all bool) error {
	records, _, err := s.store.ListSandboxes(ctx, store.SandboxFilter{
		AllTenants: true, Node: nodeID,
		States: []string{api.StateCreating, api.StateRunning, api.StatePaused, api.StateLost},
	})
	if err != nil {
		return fmt.Errorf("reconcile node %s: %w", nodeID, err)
	}
	running, err := c.List(ctx)
	if err != nil {
		return fmt.Errorf("reconcile node %s: %w", nodeID, err)
	}
	onNode := map[string]bool{}
	for _, st := range running {
		onNode[st.ID] = true
	}
	now := time.Now().UTC()
	live := map[string]bool{}
	for _, sb := range records {
		young := !all && sb.API.State == api.StateCreating && now.Sub(sb.API.CreatedAt) < createTimeoutFor(sb.API.Backend)
		if onNode[sb.API.ID] || young {
			live[sb.API.ID] = true
			if young {
				continue
			}
			// A create the node finished is running, and so is a lost
			// sandbox found again; so is a paused sandbox the node had to
			// start again (its host rebooted), or resume would fail on it.
			if sb.API.State == api.StateCreating || sb.API.State == api.StateLost ||
				(sb.API.State == api.StatePaused && runsOn(ctx, c, sb.API.ID)) {
				prev := sb.API.State
				sb.API.State = api.StateRunning
				if err := s.store.UpdateSandbox(ctx, &sb); err != nil && !errors.Is(err, store.ErrConflict) {
					return err
				}
				if prev == api.StateLost {
					s.log.InfoContext(ctx, "reconcile: lost sandbox found again", "sandbox", sb.API.ID, "node", nodeID)
				}
			}
			continue
		}
		sb.API.State, sb.API.Error, sb.DeletedAt = api.StateFailed, "the node no longer runs this sandbox", &now
		if err := s.store.UpdateSandbox(ctx, &sb); err != nil && !errors.Is(err, store.ErrConflict) {
			return err
		}
		s.forget(sb.API.ID)
		s.log.WarnContext(ctx, "reconcile: sandbox missing on its node", "sandbox", sb.API.ID, "node", nodeID)
	}
	for id := range onNode {
		if live[id] {
			continue
		}
		if sb, err := s.store.GetSandbox(ctx, id); err == nil && sb.DeletedAt == nil && sb.API.Node == nodeID &&
			slices.Contains(liveStates, sb.API.State) {
			continue // created since the records were read
		}
		s.log.InfoContext(ctx, "reconcile: destroying orphan sandbox", "sandbox", id, "node", nodeID)
		if err := c.Destroy(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			s.log.WarnContext(ctx, "reconcile: destroy orphan", "sandbox", id, "err", err)
		}
	}
	return nil
}
