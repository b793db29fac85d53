package edge_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/testutil"
)

func TestCheckProtocol(t *testing.T) {
	for _, tc := range []struct {
		protocol int
		ok       bool
		advice   string
	}{
		{0, true, ""}, // an edge older than the exchange speaks 1
		{edge.ProtocolVersion, true, ""},
		{edge.ProtocolVersion + 1, false, "upgrade the control plane"},
		{edge.MinProtocolVersion - 1 - 100, false, "upgrade the edge"},
	} {
		err := edge.CheckProtocol(edge.Heartbeat{ID: "n1", Version: "b1", Protocol: tc.protocol})
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), tc.advice)) {
			t.Errorf("protocol %d: %v", tc.protocol, err)
		}
	}
}

// refusing is a control plane that refuses every heartbeat as one that
// does not speak the node's protocol would.
type refusing struct {
	mu sync.Mutex
	n  int
}

func (r *refusing) Heartbeat(ctx context.Context, hb edge.Heartbeat) (edge.HeartbeatReply, error) {
	r.mu.Lock()
	r.n++
	r.mu.Unlock()
	return edge.HeartbeatReply{}, fmt.Errorf("node %s speaks edge protocol %d: %w", hb.ID, hb.Protocol, errdefs.ErrFailedPrecondition)
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// An edge the control plane refuses logs it as an error, with its own
// build and protocol, once (not at every heartbeat), and keeps trying.
func TestJoinLogsARefusal(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	e, err := edge.New(context.Background(), edge.Config{NodeID: "n1", Capacity: api.Resources{CPU: 1, MemoryMB: 512}, Logger: log,
		Load: func(context.Context) api.NodeLoad { return api.NodeLoad{} }})
	if err != nil {
		t.Fatal(err)
	}
	cp := &refusing{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { e.Join(ctx, cp, edge.JoinConfig{Interval: 10 * time.Millisecond}); close(done) }()
	testutil.EventuallyTrue(t, 10*time.Second, "refused three times", func() bool {
		cp.mu.Lock()
		defer cp.mu.Unlock()
		return cp.n >= 3
	})
	cancel()
	<-done
	out := logs.String()
	if c := strings.Count(out, "the control plane refuses this node"); c != 1 {
		t.Fatalf("refusal logged %d times, want once:\n%s", c, out)
	}
	for _, want := range []string{"level=ERROR", "speaks edge protocol 1", fmt.Sprintf("protocol=%d", edge.ProtocolVersion), "build="} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
