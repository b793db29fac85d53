package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
)

// Heartbeat is what a node tells the control plane every few seconds
// (POST /v1/cluster/heartbeat). The first one registers the node: the
// control plane then calls the edge back at Addr with Token to check that
// it is reachable and is the node it claims to be.
type Heartbeat struct {
	ID string `json:"id"`
	// Addr is where the control plane reaches the edge API:
	// "http://host:port" (or "unix:///path" for the all-in-one's own node).
	Addr string `json:"addr"`
	// Token is the bearer token the control plane must send to the edge.
	Token     string            `json:"token,omitempty"`
	Capacity  api.Resources     `json:"capacity"`
	Backends  []string          `json:"backends"`
	Labels    map[string]string `json:"labels,omitempty"`
	Load      api.NodeLoad      `json:"load"`
	Sandboxes int               `json:"sandboxes"`
	// Layers are the digests of the layers cached on the node; null when
	// they did not change since the last heartbeat that carried them.
	Layers []string `json:"layers"`
	// Version is the edge's build; Protocol the edge protocol version it
	// speaks (ProtocolVersion; 0 from edges older than the exchange,
	// which spoke 1). A control plane refuses a protocol it does not
	// speak with a failed precondition.
	Version  string `json:"version,omitempty"`
	Protocol int    `json:"protocol,omitempty"`
}

// HeartbeatReply is the control plane's answer.
type HeartbeatReply struct {
	// State is the node's state as the control plane sees it: "up" or
	// "draining".
	State string `json:"state"`
	// Version and Protocol are the control plane's build and the newest
	// edge protocol it speaks (empty and 0 from an older one).
	Version  string `json:"version,omitempty"`
	Protocol int    `json:"protocol,omitempty"`
}

// ControlPlane is what a node reports to: the control plane's HTTP API
// (JoinClient), or the all-in-one server in the same process.
type ControlPlane interface {
	Heartbeat(ctx context.Context, hb Heartbeat) (HeartbeatReply, error)
}

// JoinClient sends heartbeats to a control plane over HTTP, authenticated
// with the cluster token.
type JoinClient struct {
	url   string
	token string
	hc    *http.Client
}

// NewJoinClient returns a client for the control plane at url.
func NewJoinClient(url, clusterToken string) (*JoinClient, error) {
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return nil, errdefs.Invalid("control plane URL %q: want http://host:port", url)
	}
	return &JoinClient{url: strings.TrimSuffix(url, "/"), token: clusterToken, hc: &http.Client{Timeout: 10 * time.Second}}, nil
}

// Heartbeat implements ControlPlane.
func (c *JoinClient) Heartbeat(ctx context.Context, hb Heartbeat) (HeartbeatReply, error) {
	var reply HeartbeatReply
	b, err := json.Marshal(hb)
	if err != nil {
		return reply, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/cluster/heartbeat", bytes.NewReader(b))
	if err != nil {
		return reply, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return reply, fmt.Errorf("heartbeat to %s: %w: %w", c.url, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return reply, httpapi.ReadError(resp)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&reply); err != nil {
		return reply, fmt.Errorf("heartbeat reply: %w", err)
	}
	return reply, nil
}

// JoinConfig says how a node reports to its control plane.
type JoinConfig struct {
	// Addr and Token are how the control plane reaches this edge.
	Addr, Token string
	Labels      map[string]string
	// Interval is the time between heartbeats; 2 s by default.
	Interval time.Duration
}

// fullLayersEvery is how often a heartbeat carries the cached layers even
// when they did not change, so that a control plane that lost them (a new
// database) learns them again.
const fullLayersEvery = 15

// Heartbeat builds this node's heartbeat. withLayers forces the cached
// layers in; otherwise they are included only when they changed since
// the last heartbeat built with them.
func (e *Edge) Heartbeat(ctx context.Context, cfg JoinConfig, withLayers bool) Heartbeat {
	info := e.Info()
	hb := Heartbeat{
		ID: info.ID, Addr: cfg.Addr, Token: cfg.Token, Capacity: info.Capacity, Backends: info.Backends,
		Labels: cfg.Labels, Sandboxes: info.Sandboxes, Version: BuildVersion(), Protocol: ProtocolVersion,
	}
	if e.cfg.Load != nil {
		hb.Load = e.cfg.Load(ctx)
	} else {
		hb.Load = e.load.measure(ctx, e.cfg.Backends)
		e.measureDisk(&hb.Load)
	}
	layers, gen := e.cachedLayers()
	e.mu.Lock()
	if withLayers || gen != e.sentLayersGen {
		hb.Layers = layers
		e.sentLayersGen = gen
	}
	e.mu.Unlock()
	return hb
}

// Join reports to the control plane every cfg.Interval until ctx ends.
// The first heartbeat registers the node. Failures are logged and retried
// at the next tick; after one, the next heartbeat carries the layers
// again.
func (e *Edge) Join(ctx context.Context, cp ControlPlane, cfg JoinConfig) {
	if cfg.Interval <= 0 {
		cfg.Interval = 2 * time.Second
	}
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	failing, refused, beat, state := false, false, 0, ""
	for {
		hctx, cancel := context.WithTimeout(ctx, max(cfg.Interval, 5*time.Second))
		reply, err := cp.Heartbeat(hctx, e.Heartbeat(hctx, cfg, failing || beat%fullLayersEvery == 0))
		cancel()
		beat++
		switch {
		case err != nil && ctx.Err() == nil && errors.Is(err, errdefs.ErrFailedPrecondition):
			// Refused, not unreachable: say so loudly, every time it
			// starts; it will not pass by itself.
			if !refused {
				e.log.ErrorContext(ctx, "the control plane refuses this node; retrying, but it will not join until one side is upgraded",
					"err", err, "build", BuildVersion(), "protocol", ProtocolVersion)
			}
			failing, refused = true, true
		case err != nil && ctx.Err() == nil:
			if !failing {
				e.log.WarnContext(ctx, "heartbeat failed; retrying", "err", err)
			}
			failing, refused = true, false
		case err == nil:
			if failing || reply.State != state {
				e.log.InfoContext(ctx, "joined control plane", "state", reply.State,
					"control_plane_build", reply.Version, "control_plane_protocol", reply.Protocol)
			}
			failing, refused, state = false, false, reply.State
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// maxCachedLayers bounds the list of recently used layers a node reports.
const maxCachedLayers = 4096

// CachedLayers is implemented by layer sources that know what they have
// on the node (a node-local cache of a shared store).
type CachedLayers interface {
	Cached() []string
}

// noteLayer records that a layer was used on this node.
func (e *Edge) noteLayer(digest string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.layersUsed[digest]; !ok {
		e.layersGen++
		if len(e.layersUsed) >= maxCachedLayers {
			oldest, at := "", time.Now()
			for d, t := range e.layersUsed {
				if t.Before(at) {
					oldest, at = d, t
				}
			}
			delete(e.layersUsed, oldest)
		}
	}
	e.layersUsed[digest] = time.Now()
}

// cachedLayers lists the layers this node has: what its layer source
// reports, or else the layers its sandboxes used lately. gen changes when
// the list may have.
func (e *Edge) cachedLayers() ([]string, uint64) {
	if c, ok := e.cfg.Layers.(CachedLayers); ok {
		l := c.Cached()
		slices.Sort(l)
		var h uint64 = 14695981039346656037
		for _, d := range l {
			for i := 0; i < len(d); i++ {
				h = (h ^ uint64(d[i])) * 1099511628211
			}
		}
		return l, h
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Sorted(maps.Keys(e.layersUsed)), e.layersGen
}
