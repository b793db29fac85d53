// Package fncall keeps warm pools of pre-created sandboxes, one pool per
// tenant and sandbox spec (layer stack, resources, environment), for the
// FnCall backend: short calls that should not pay for a sandbox's creation.
// A call leases a clean sandbox, runs, and hands it back; the sandbox is
// reset off the request path before anyone gets it again. Pools grow with
// demand (the peak of busy, resetting and waiting over a window) between a
// minimum and a maximum, and idle pools shrink to zero. A call on an empty
// or fully busy pool waits for the next free sandbox within its deadline.
// Calls in flight are limited per tenant.
//
// The package holds no durable state and never builds, resets or destroys a
// sandbox itself: it asks its Runtime (the control plane) to. It must never
// hand one tenant's sandbox to another tenant, nor a used sandbox to a call
// before its reset finished.
package fncall

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// Sandbox is a pool sandbox as the Runtime made it.
type Sandbox struct {
	ID   string
	Node string
}

// Runtime builds, resets and destroys the sandboxes of the pools.
type Runtime interface {
	// Create builds a sandbox of spec for tenant, marked as a member of pool.
	Create(ctx context.Context, tenant, pool string, spec any) (Sandbox, error)
	// Recycle brings a used sandbox back to the clean state of its layers:
	// as it is if nothing of it changed, by a reset otherwise (restarted).
	Recycle(ctx context.Context, sb Sandbox) (restarted bool, err error)
	// Destroy removes a sandbox; destroying a missing one succeeds.
	Destroy(ctx context.Context, sb Sandbox) error
}

// Config tunes the pools.
type Config struct {
	// Min and Max bound the size of each pool. Min 0 lets idle pools
	// vanish.
	Min, Max int
	// TenantConcurrency bounds the calls of one tenant in flight at once
	// (waiting for a sandbox included).
	TenantConcurrency int
	// IdleTimeout is how long a sandbox beyond the pool's target may stay
	// idle before it is destroyed.
	IdleTimeout time.Duration
	// Window is how far back demand is remembered when sizing a pool.
	Window time.Duration
	// MaxAge recycles a sandbox that has served calls for this long.
	MaxAge time.Duration
	// OpTimeout bounds one create, reset or destroy.
	OpTimeout time.Duration
	// Tick is how often pools are resized.
	Tick   time.Duration
	Logger *slog.Logger
}

// DefaultConfig are the defaults of `dsec server`.
var DefaultConfig = Config{
	Min: 0, Max: 64, TenantConcurrency: 256,
	IdleTimeout: 60 * time.Second, Window: 30 * time.Second, MaxAge: time.Hour,
	OpTimeout: 2 * time.Minute, Tick: time.Second,
}

// Info describes a pool for listings; the Manager keeps it as given.
type Info struct {
	Tenant string
	// Describe is returned by Pools as is (the API's view of the spec).
	Describe any
}

// PoolStats is a snapshot of one pool.
type PoolStats struct {
	ID                                    string
	Describe                              any
	Size, Idle, Busy, Resetting, Creating int
	Waiting, Target, Min, Max             int
	Calls                                 int64
	// Resets counts the calls after which the sandbox had to be reset
	// (the others changed nothing and it was handed on as it was).
	Resets int64
}

// Lease is a sandbox handed to one call.
type Lease struct {
	m *member
}

// Sandbox is the leased sandbox.
func (l *Lease) Sandbox() Sandbox { return l.m.sb }

// Pool is the id of the pool it came from (its label value).
func (l *Lease) Pool() string { return l.m.pool.id }

// Manager owns every pool.
type Manager struct {
	cfg Config
	rt  Runtime
	log *slog.Logger
	wg  sync.WaitGroup // background creates, resets and destroys

	mu      sync.Mutex
	pools   map[string]*pool   // by key
	byID    map[string]*member // by sandbox id
	tenants map[string]chan struct{}
	// closed: Close was called; every sandbox that comes back is
	// destroyed, nothing new is made.
	closed     bool
	destroying int // destroys in flight

	now func() time.Time // the clock; tests move it
}

// New returns a Manager; call Run to have pools resized and shrunk.
func New(cfg Config, rt Runtime) *Manager {
	d := DefaultConfig
	if cfg.Max <= 0 {
		cfg.Max = d.Max
	}
	cfg.Min = min(max(cfg.Min, 0), cfg.Max)
	if cfg.TenantConcurrency <= 0 {
		cfg.TenantConcurrency = d.TenantConcurrency
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = d.IdleTimeout
	}
	if cfg.Window <= 0 {
		cfg.Window = d.Window
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = d.MaxAge
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = d.OpTimeout
	}
	if cfg.Tick <= 0 {
		cfg.Tick = d.Tick
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Manager{
		cfg: cfg, rt: rt, log: cfg.Logger,
		pools: map[string]*pool{}, byID: map[string]*member{}, tenants: map[string]chan struct{}{},
		now: time.Now,
	}
}

// Config is the configuration in force, defaults filled in.
func (m *Manager) Config() Config { return m.cfg }

// Acquire leases a clean sandbox of the pool key (made of spec for the
// tenant if the pool does not exist yet). It waits for a free one until
// ctx ends. A call (as opposed to a handover to a create) also takes one
// of the tenant's call slots until Release or Detach.
func (m *Manager) Acquire(ctx context.Context, key string, info Info, spec any, call bool) (*Lease, error) {
	if call {
		if err := m.takeSlot(ctx, info.Tenant); err != nil {
			return nil, err
		}
	}
	l, err := m.acquire(ctx, key, info, spec)
	if err != nil {
		if call {
			m.giveSlot(info.Tenant)
		}
		return nil, err
	}
	l.m.call = call
	return l, nil
}

func (m *Manager) slots(tenant string) chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch, ok := m.tenants[tenant]
	if !ok {
		ch = make(chan struct{}, m.cfg.TenantConcurrency)
		m.tenants[tenant] = ch
	}
	return ch
}

func (m *Manager) takeSlot(ctx context.Context, tenant string) error {
	select {
	case m.slots(tenant) <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the tenant's %d concurrent calls were all busy until the call's deadline: %w",
			m.cfg.TenantConcurrency, ctx.Err())
	}
}

func (m *Manager) giveSlot(tenant string) { <-m.slots(tenant) }

func (m *Manager) acquire(ctx context.Context, key string, info Info, spec any) (*Lease, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, errClosed
	}
	p, ok := m.pools[key]
	if !ok {
		p = newPool(m, key, info, spec)
		m.pools[key] = p
	}
	p.lastActive = m.now()
	if mem := p.popIdle(); mem != nil {
		mem.state = stateBusy
		p.busy++
		p.note()
		m.mu.Unlock()
		return &Lease{m: mem}, nil
	}
	w := &waiter{ch: make(chan result, 1)}
	p.waiters = append(p.waiters, w)
	p.note()
	m.grow(p)
	m.mu.Unlock()

	select {
	case r := <-w.ch:
		if r.err != nil {
			return nil, r.err
		}
		return &Lease{m: r.m}, nil
	case <-ctx.Done():
	}
	m.mu.Lock()
	p.removeWaiter(w)
	m.mu.Unlock()
	select {
	case r := <-w.ch: // handed over just as we gave up: it is clean, pass it on
		if r.m != nil {
			m.mu.Lock()
			p.busy--
			m.deliver(p, r.m)
			m.mu.Unlock()
		}
	default:
	}
	return nil, fmt.Errorf("no sandbox of fncall pool %s became free before the call's deadline: %w", p.id, ctx.Err())
}

// Release hands a leased sandbox back after its call. It is reset in the
// background and only then given to the next call; with clean false (the
// call saw the sandbox misbehave) it is destroyed instead.
func (m *Manager) Release(l *Lease, clean bool) {
	mem := l.m
	if mem.call {
		m.giveSlot(mem.pool.tenant)
	}
	m.mu.Lock()
	p := mem.pool
	p.busy--
	p.calls++
	if mem.forgotten {
		p.note()
		m.mu.Unlock()
		return
	}
	if m.closed {
		m.remove(mem)
		m.destroyLater(mem)
		p.note()
		m.mu.Unlock()
		return
	}
	mem.state = stateResetting
	p.resetting++
	p.note()
	m.mu.Unlock()

	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		var err error
		restarted := false
		if clean && m.now().Sub(mem.born) < m.cfg.MaxAge {
			ctx, cancel := context.WithTimeout(context.Background(), m.cfg.OpTimeout)
			restarted, err = m.rt.Recycle(ctx, mem.sb)
			cancel()
			if err != nil {
				m.log.WarnContext(ctx, "fncall: reset failed; destroying the sandbox", "sandbox", mem.sb.ID, "pool", p.id, "err", err)
			}
		} else {
			err = errRetire
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		p.resetting--
		if restarted {
			p.resets++
		}
		if mem.forgotten {
			return
		}
		if err != nil {
			m.remove(mem)
			m.destroyLater(mem)
			m.grow(p)
			return
		}
		m.deliver(p, mem)
	}()
}

var errRetire = fmt.Errorf("retired")

// Detach takes a leased sandbox out of its pool for good: a create with
// backend fncall got it. The pool refills as demand says.
func (m *Manager) Detach(l *Lease) Sandbox {
	mem := l.m
	if mem.call {
		m.giveSlot(mem.pool.tenant)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	mem.pool.busy--
	if !mem.forgotten {
		m.remove(mem)
	}
	m.grow(mem.pool)
	return mem.sb
}

// Forget drops a sandbox from its pool because it is being destroyed by
// someone else (a DELETE of the sandbox, an expiry). It reports whether the
// sandbox belonged to a pool.
func (m *Manager) Forget(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	mem, ok := m.byID[id]
	if !ok {
		return false
	}
	if mem.state == stateIdle {
		mem.pool.dropIdle(mem)
	}
	m.remove(mem)
	return true
}

// Warm makes the pool of key hold at least size sandboxes (within Max) and
// remembers that demand for a window, so they are not shrunk at once.
func (m *Manager) Warm(key string, info Info, spec any, size int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.pools[key]
	if !ok {
		p = newPool(m, key, info, spec)
		m.pools[key] = p
	}
	p.lastActive = m.now()
	size = min(size, m.cfg.Max)
	p.noteDemand(size)
	for p.size() < size {
		m.startCreate(p)
	}
	return size
}

// Pools lists the tenant's pools.
func (m *Manager) Pools(tenant string) []PoolStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []PoolStats
	for _, p := range m.pools {
		if p.tenant == tenant {
			out = append(out, p.stats())
		}
	}
	return out
}

// Run resizes pools every Tick until ctx ends, then waits for the
// background work it started.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			m.wg.Wait()
			return
		case <-t.C:
		}
		m.resize()
	}
}

// Wait waits for background creates, resets and destroys to finish.
func (m *Manager) Wait() { m.wg.Wait() }

// errClosed refuses a call once the server is stopping.
var errClosed = fmt.Errorf("fncall pools are closed: the server is stopping: %w", errdefs.ErrUnavailable)

// Close destroys every pool's sandboxes — the idle ones at once, those
// in a call, a reset or a create as they come back — and waits for that
// until ctx ends. Waiting calls fail, and so do later ones. Pools live
// only in this process: a sandbox it left would run on until the next
// start destroyed it as a previous run's.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	for _, p := range m.pools {
		for _, mem := range p.idle {
			m.remove(mem)
			m.destroyLater(mem)
		}
		p.idle = nil
		for _, w := range p.waiters {
			w.ch <- result{err: errClosed}
		}
		p.waiters = nil
	}
	m.mu.Unlock()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		m.mu.Lock()
		left := m.destroying
		for _, p := range m.pools {
			left += p.busy + p.creating + p.resetting
		}
		m.mu.Unlock()
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fncall: %d pool sandboxes still in use or being destroyed: %w", left, ctx.Err())
		case <-t.C:
		}
	}
}

// resize grows each pool to its target and shrinks what idled too long.
func (m *Manager) resize() {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	for key, p := range m.pools {
		p.note()
		target := p.target()
		for p.size() < target {
			m.startCreate(p)
		}
		// The bottom of the idle stack is the least recently used.
		for i := 0; i < len(p.idle); {
			mem := p.idle[i]
			old := now.Sub(mem.born) >= m.cfg.MaxAge
			if (p.size() > target && now.Sub(mem.lastUsed) >= m.cfg.IdleTimeout) || old {
				p.idle = append(p.idle[:i], p.idle[i+1:]...)
				m.remove(mem)
				m.destroyLater(mem)
				continue
			}
			i++
		}
		if p.size() == 0 && len(p.waiters) == 0 && now.Sub(p.lastActive) >= m.cfg.Window {
			delete(m.pools, key)
		}
	}
}

// grow starts creates for waiters that no reset or create in flight will
// serve. Preconditions: m.mu is held.
func (m *Manager) grow(p *pool) {
	if m.closed {
		return
	}
	need := len(p.waiters) - p.creating - p.resetting
	for ; need > 0 && p.size() < m.cfg.Max; need-- {
		m.startCreate(p)
	}
}

// startCreate builds one more sandbox for p in the background.
// Preconditions: m.mu is held.
func (m *Manager) startCreate(p *pool) {
	p.creating++
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.OpTimeout)
		sb, err := m.rt.Create(ctx, p.tenant, p.id, p.spec)
		cancel()
		m.mu.Lock()
		defer m.mu.Unlock()
		p.creating--
		if err != nil {
			m.log.WarnContext(ctx, "fncall: create a pool sandbox", "pool", p.id, "tenant", p.tenant, "err", err)
			if p.size() == 0 {
				// Nothing else is coming: tell the waiters why.
				for _, w := range p.waiters {
					w.ch <- result{err: fmt.Errorf("fncall pool %s: %w", p.id, err)}
				}
				p.waiters = nil
			}
			return
		}
		now := m.now()
		mem := &member{sb: sb, pool: p, born: now, lastUsed: now}
		m.byID[sb.ID] = mem
		m.deliver(p, mem)
	}()
}

// deliver gives a clean sandbox to the first waiter, or makes it idle.
// Preconditions: m.mu is held.
func (m *Manager) deliver(p *pool, mem *member) {
	if m.closed {
		m.remove(mem)
		m.destroyLater(mem)
		return
	}
	mem.lastUsed = m.now()
	if len(p.waiters) > 0 {
		w := p.waiters[0]
		p.waiters = p.waiters[1:]
		mem.state = stateBusy
		p.busy++
		w.ch <- result{m: mem}
		return
	}
	mem.state = stateIdle
	p.idle = append(p.idle, mem)
}

// remove forgets a member. Preconditions: m.mu is held, and mem is in no
// idle list.
func (m *Manager) remove(mem *member) {
	mem.forgotten = true
	delete(m.byID, mem.sb.ID)
}

// destroyLater destroys a removed member in the background.
// Preconditions: m.mu is held.
func (m *Manager) destroyLater(mem *member) {
	m.destroying++
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.OpTimeout)
		defer cancel()
		if err := m.rt.Destroy(ctx, mem.sb); err != nil {
			m.log.WarnContext(ctx, "fncall: destroy a pool sandbox", "sandbox", mem.sb.ID, "err", err)
		}
		m.mu.Lock()
		m.destroying--
		m.mu.Unlock()
	}()
}
