package server_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/sim"
)

// rewrite is a control plane seen through a node that changes its
// heartbeats (as another build of the edge would send them).
type rewrite struct {
	cp    edge.ControlPlane
	f     func(*edge.Heartbeat)
	reply edge.HeartbeatReply
}

func (r *rewrite) Heartbeat(ctx context.Context, hb edge.Heartbeat) (edge.HeartbeatReply, error) {
	r.f(&hb)
	reply, err := r.cp.Heartbeat(ctx, hb)
	r.reply = reply
	return reply, err
}

// A node's heartbeat carries its build and protocol version; the control
// plane accepts any build that speaks its protocol (and an edge older
// than the exchange, which sends none), answers with its own, and
// refuses a protocol it does not speak with a failed precondition that
// names both sides' versions, without registering the node.
func TestHeartbeatProtocolVersion(t *testing.T) {
	ctx := context.Background()
	c := sim.NewCluster()
	addNodes(t, c, 1, api.Resources{CPU: 8, MemoryMB: 10000}, nil, "n")
	r := newReplica(t, openSQLite(t), c, filepath.Join(t.TempDir(), "admin.key"))

	var sent edge.Heartbeat
	same := &rewrite{cp: r.srv, f: func(hb *edge.Heartbeat) { sent = *hb }}
	if err := c.Heartbeat(ctx, same); err != nil {
		t.Fatal(err)
	}
	if sent.Protocol != edge.ProtocolVersion || sent.Version == "" {
		t.Errorf("heartbeat carries protocol %d, build %q; want %d and a build", sent.Protocol, sent.Version, edge.ProtocolVersion)
	}
	if same.reply.Protocol != edge.ProtocolVersion || same.reply.Version != edge.BuildVersion() {
		t.Errorf("reply carries protocol %d, build %q; want %d, %q", same.reply.Protocol, same.reply.Version, edge.ProtocolVersion, edge.BuildVersion())
	}
	for _, f := range []func(*edge.Heartbeat){
		func(hb *edge.Heartbeat) { hb.Version = "another-build" },    // same protocol, other build
		func(hb *edge.Heartbeat) { hb.Version, hb.Protocol = "", 0 }, // older than the exchange
	} {
		if err := c.Heartbeat(ctx, &rewrite{cp: r.srv, f: f}); err != nil {
			t.Errorf("heartbeat refused: %v", err)
		}
	}

	c2 := sim.NewCluster()
	addNodes(t, c2, 1, api.Resources{CPU: 8, MemoryMB: 10000}, nil, "future")
	newer := &rewrite{cp: r.srv, f: func(hb *edge.Heartbeat) { hb.Version, hb.Protocol = "v9", edge.ProtocolVersion+1 }}
	err := c2.Heartbeat(ctx, newer)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a newer protocol: %v, want a failed precondition", err)
	}
	for _, want := range []string{"future0", "edge protocol 2", "build v9", "upgrade the control plane"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	nodes, err := r.client.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == "future0" {
			t.Errorf("a refused node was registered: %+v", n)
		}
	}
}
