package edge

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// displayTTL is how long the edge answers a sandbox's screen size (or
// that it has none) from what it last learned, without asking the agent
// (or, in a full VM, taking a screenshot). The control plane asks on every
// GET of the sandbox; a desktop's X server that comes up after the create
// (autostart), or goes away, shows within this time.
var displayTTL = 2 * time.Second

// displayCache is the last answer to "what screen does this sandbox have".
type displayCache struct {
	// mu is held across the question too: concurrent GETs share one.
	mu   sync.Mutex
	at   time.Time // zero: ask
	size api.Display
	err  error // the sandbox has no screen (errdefs.ErrInvalid)
}

// get answers from the cache while it is fresh, or asks.
func (c *displayCache) get(ctx context.Context, ask func(context.Context) (api.Display, error)) (api.Display, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < displayTTL {
		return c.size, c.err
	}
	size, err := ask(ctx)
	if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
		c.at = time.Time{} // unreachable agent, timeout: ask again next time
		return size, err
	}
	c.at, c.size, c.err = time.Now(), size, err
	return size, err
}

// forget makes the next question go to the sandbox (after a reset, which
// restarts its processes, X server included).
func (c *displayCache) forget() {
	c.mu.Lock()
	c.at = time.Time{}
	c.mu.Unlock()
}
