package fncall

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"time"
)

type memberState int

const (
	stateIdle memberState = iota
	stateBusy
	stateResetting
)

// member is one sandbox of a pool.
type member struct {
	sb       Sandbox
	pool     *pool
	born     time.Time
	lastUsed time.Time
	// The fields below are guarded by Manager.mu.
	state     memberState
	call      bool // leased by a call (holds a tenant slot)
	forgotten bool // no longer in the pool: never reset or handed out again
}

type result struct {
	m   *member
	err error
}

type waiter struct{ ch chan result } // buffered 1: delivery never blocks

// bucket is the peak demand seen in one second.
type bucket struct {
	sec  int64
	peak int
}

// pool is the warm sandboxes of one tenant and spec. Every field is
// guarded by Manager.mu.
type pool struct {
	m      *Manager
	key    string
	id     string
	tenant string
	spec   any
	info   Info

	idle                      []*member // a stack: the most recently used on top
	busy, resetting, creating int
	waiters                   []*waiter // FIFO
	calls, resets             int64
	lastActive                time.Time
	hist                      []bucket // one per second of the window
}

// PoolID is the id of the pool of a key: the value of its sandboxes'
// pool label.
func PoolID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "fp-" + hex.EncodeToString(sum[:6])
}

func newPool(m *Manager, key string, info Info, spec any) *pool {
	return &pool{
		m: m, key: key, id: PoolID(key), tenant: info.Tenant, spec: spec, info: info,
		lastActive: m.now(), hist: make([]bucket, max(1, int(m.cfg.Window/time.Second))),
	}
}

func (p *pool) size() int { return len(p.idle) + p.busy + p.resetting + p.creating }

func (p *pool) popIdle() *member {
	if len(p.idle) == 0 {
		return nil
	}
	mem := p.idle[len(p.idle)-1]
	p.idle = p.idle[:len(p.idle)-1]
	return mem
}

func (p *pool) dropIdle(mem *member) {
	if i := slices.Index(p.idle, mem); i >= 0 {
		p.idle = slices.Delete(p.idle, i, i+1)
	}
}

func (p *pool) removeWaiter(w *waiter) {
	if i := slices.Index(p.waiters, w); i >= 0 {
		p.waiters = slices.Delete(p.waiters, i, i+1)
	}
}

// note records the pool's current demand: sandboxes in use or being made
// clean, and calls waiting for one.
func (p *pool) note() { p.noteDemand(p.busy + p.resetting + len(p.waiters)) }

func (p *pool) noteDemand(d int) {
	sec := p.m.now().Unix()
	b := &p.hist[sec%int64(len(p.hist))]
	if b.sec != sec {
		*b = bucket{sec: sec}
	}
	b.peak = max(b.peak, d)
}

// target is the size demand asks for: the peak over the window, within
// the configured bounds.
func (p *pool) target() int {
	now := p.m.now().Unix()
	peak := 0
	for _, b := range p.hist {
		if now-b.sec < int64(len(p.hist)) {
			peak = max(peak, b.peak)
		}
	}
	return min(max(peak, p.m.cfg.Min), p.m.cfg.Max)
}

func (p *pool) stats() PoolStats {
	return PoolStats{
		ID: p.id, Describe: p.info.Describe,
		Size: p.size(), Idle: len(p.idle), Busy: p.busy, Resetting: p.resetting, Creating: p.creating,
		Waiting: len(p.waiters), Target: p.target(), Min: p.m.cfg.Min, Max: p.m.cfg.Max, Calls: p.calls,
		Resets: p.resets,
	}
}
