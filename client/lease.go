package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
)

// Renew extends a sandbox's lease: it then ends ttl from now (rounded down
// to seconds; 0 means the sandbox's own ttl_seconds). A renew also counts
// as activity for the idle timeout.
func (c *Client) Renew(ctx context.Context, id string, ttl time.Duration) (*api.Sandbox, error) {
	var sb api.Sandbox
	req := api.RenewRequest{TTLSeconds: int64(ttl / time.Second)}
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/renew", nil, req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Keepalive renews a sandbox's lease in the background while a program
// holds the sandbox, so that it lives as long as the program does and
// expires on its own, ttl after the program died or called Stop.
type Keepalive struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	err error // the last renew's error; nil after a success
}

// Keepalive starts renewing sandbox id with ttl (0: the sandbox's own
// ttl_seconds) every third of the lease, sooner after a failure. It stops
// when ctx ends, Stop is called, or the sandbox is gone (then Err says
// why).
func (c *Client) Keepalive(ctx context.Context, id string, ttl time.Duration) *Keepalive {
	ctx, cancel := context.WithCancel(ctx)
	k := &Keepalive{cancel: cancel, done: make(chan struct{})}
	go k.run(ctx, c, id, ttl)
	return k
}

func (k *Keepalive) run(ctx context.Context, c *Client, id string, ttl time.Duration) {
	defer close(k.done)
	every := ttl / 3
	for {
		sb, err := c.Renew(ctx, id, ttl)
		if ctx.Err() != nil {
			return
		}
		k.mu.Lock()
		k.err = err
		k.mu.Unlock()
		wait := every
		switch {
		case err == nil && ttl == 0:
			every = time.Duration(sb.TTLSeconds) * time.Second / 3
			wait = every
		case IsNotFound(err):
			return // deleted, failed or reaped: nothing left to keep
		case err != nil:
			wait = min(every/4, 5*time.Second)
		}
		if wait <= 0 {
			wait = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// Stop stops renewing and returns the last renew's error.
func (k *Keepalive) Stop() error {
	k.cancel()
	<-k.done
	return k.Err()
}

// Done is closed when the keepalive stopped.
func (k *Keepalive) Done() <-chan struct{} { return k.done }

// Err is the last renew's error, nil if it succeeded.
func (k *Keepalive) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// GetTrajectory reads a trajectory's log: its steps, without their output.
func (c *Client) GetTrajectory(ctx context.Context, id string) (*api.TrajectoryLog, error) {
	var out api.TrajectoryLog
	if err := c.do(ctx, http.MethodGet, "/v1/trajectories/"+trajectoryPath(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteTrajectory drops a trajectory's steps from step fromStep on (the
// whole trajectory for 0), so that they run again when replayed.
func (c *Client) DeleteTrajectory(ctx context.Context, id string, fromStep int64) error {
	var q url.Values
	if fromStep > 0 {
		q = url.Values{"from_step": {strconv.FormatInt(fromStep, 10)}}
	}
	return c.do(ctx, http.MethodDelete, "/v1/trajectories/"+trajectoryPath(id), q, nil, nil)
}

// trajectoryPath escapes a trajectory id for the URL, keeping its slashes.
func trajectoryPath(id string) string {
	return (&url.URL{Path: id}).EscapedPath()
}
