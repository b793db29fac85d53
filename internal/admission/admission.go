// Package admission holds creates that cannot be placed yet only because
// the nodes with room for them are busy (their sandboxes' measured CPU),
// and lets them through, fairly across tenants, as soon as a placement
// attempt succeeds. Busy CPU slows creates down; it never fails them
// before their own deadline.
//
// The queue knows nothing of nodes or load: a waiter brings a Try that
// attempts its placement (in the control plane, a scheduler reservation)
// and says whether it went through, could not yet, or failed for good.
// The queue decides only who tries when. It must never block on I/O while
// holding its lock: a Try is a fast, in-memory decision.
package admission

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Try attempts a waiter's placement. It returns true when it went
// through (the waiter is admitted), false with a nil error when it cannot
// yet (the waiter keeps its place), or an error that waiting does not cure
// (the waiter leaves with it). It runs under the queue's lock, from the
// waiter's goroutine or the queue's, one at a time.
type Try func() (bool, error)

// ErrGone is what Wait returns when the caller said it no longer wants
// the placement (its client went away).
var ErrGone = errors.New("the caller went away while waiting for admission")

// Queue is the admission queue. Its zero value is not usable: call New.
type Queue struct {
	poll time.Duration
	kick chan struct{}

	mu sync.Mutex
	// ring holds the tenants with waiters in turn order; turn indexes the
	// tenant whose head waiter tries next.
	ring    []*line
	turn    int
	lines   map[string]*line
	waiting int
	running bool // a dispatcher goroutine runs
	stats   Stats
}

// line is one tenant's waiters, first come first served.
type line struct {
	tenant  string
	waiters []*waiter
}

type waiter struct {
	try   Try
	since time.Time
	done  chan struct{} // closed once admitted or failed by a Try
	err   error
}

// Stats describe the queue.
type Stats struct {
	// Waiting is how many creates wait now, from how many tenants.
	Waiting, Tenants int
	// Oldest is how long the longest waiting create has waited.
	Oldest time.Duration
	// Admitted counts the creates let through after waiting; TimedOut
	// those whose deadline came first; Left those whose caller went away
	// or whose Try failed for good while waiting.
	Admitted, TimedOut, Left int64
}

// New returns a queue whose waiters try again on every Kick and at least
// every poll.
func New(poll time.Duration) *Queue {
	if poll <= 0 {
		poll = 250 * time.Millisecond
	}
	return &Queue{poll: poll, kick: make(chan struct{}, 1), lines: map[string]*line{}}
}

// Kick makes the waiters try again now: call it when load may have
// fallen (a heartbeat, a refreshed view of the nodes).
func (q *Queue) Kick() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Wait places a create of tenant. When nobody waits, try runs at once;
// if it cannot place yet, or others already wait (no one jumps the
// queue), the create waits its turn: tenants take turns, and within a
// tenant creates go in arrival order. Wait returns how long it waited and
// nil once try went through; try's error if it failed for good;
// context.Cause(ctx) when ctx ends first (its deadline is the create's
// own bound on waiting); ErrGone when gone is closed first. A waiter
// admitted just as ctx ends counts as admitted: its placement was made.
func (q *Queue) Wait(ctx context.Context, gone <-chan struct{}, tenant string, try Try) (time.Duration, error) {
	q.mu.Lock()
	if q.waiting == 0 {
		ok, err := try()
		if ok || err != nil {
			q.mu.Unlock()
			return 0, err
		}
	}
	if ctx.Err() != nil {
		q.mu.Unlock()
		return 0, context.Cause(ctx)
	}
	w := &waiter{try: try, since: time.Now(), done: make(chan struct{})}
	q.push(tenant, w)
	if !q.running {
		q.running = true
		go q.dispatch()
	}
	q.mu.Unlock()

	var why error
	select {
	case <-w.done:
		return time.Since(w.since), w.err
	case <-ctx.Done():
		why = context.Cause(ctx)
	case <-gone:
		why = ErrGone
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	select {
	case <-w.done:
		return time.Since(w.since), w.err
	default:
	}
	q.remove(tenant, w)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && why != ErrGone {
		q.stats.TimedOut++
	} else {
		q.stats.Left++
	}
	if q.waiting == 0 {
		q.Kick() // let the dispatcher see it can stop
	}
	return time.Since(w.since), why
}

// Stats returns the queue's state now.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.stats
	st.Waiting, st.Tenants = q.waiting, len(q.ring)
	now := time.Now()
	for _, l := range q.ring {
		st.Oldest = max(st.Oldest, now.Sub(l.waiters[0].since))
	}
	return st
}

// Preconditions: q.mu is held.
func (q *Queue) push(tenant string, w *waiter) {
	l := q.lines[tenant]
	if l == nil {
		// A new tenant comes last in the current turn order: just
		// before the tenant whose turn it is.
		l = &line{tenant: tenant}
		q.lines[tenant] = l
		q.ring = slices.Insert(q.ring, q.turn, l)
		if len(q.ring) > 1 {
			q.turn++
		}
	}
	l.waiters = append(l.waiters, w)
	q.waiting++
}

// remove takes w out of its tenant's line.
//
// Preconditions: q.mu is held.
func (q *Queue) remove(tenant string, w *waiter) {
	l := q.lines[tenant]
	if l == nil {
		return
	}
	i := slices.Index(l.waiters, w)
	if i < 0 {
		return
	}
	l.waiters = slices.Delete(l.waiters, i, i+1)
	q.waiting--
	if len(l.waiters) == 0 {
		q.drop(slices.Index(q.ring, l))
	}
}

// drop removes the tenant at ring index i, whose line is empty.
//
// Preconditions: q.mu is held.
func (q *Queue) drop(i int) {
	delete(q.lines, q.ring[i].tenant)
	q.ring = slices.Delete(q.ring, i, i+1)
	if i < q.turn {
		q.turn--
	}
	if q.turn >= len(q.ring) {
		q.turn = 0
	}
}

// dispatch runs rounds on every kick and poll until nobody waits.
func (q *Queue) dispatch() {
	t := time.NewTicker(q.poll)
	defer t.Stop()
	for {
		select {
		case <-q.kick:
		case <-t.C:
		}
		q.mu.Lock()
		q.round()
		if q.waiting == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}

// round lets waiters try in turn order: the head of the tenant whose turn
// it is tries; once it is through (or failed), the next tenant's turn
// comes. A head that cannot place yet keeps its place and the next tenant
// tries (its create may need other nodes); the round ends when every
// tenant's head in a row could not.
//
// Preconditions: q.mu is held.
func (q *Queue) round() {
	for stuck := 0; q.waiting > 0 && stuck < len(q.ring); {
		l := q.ring[q.turn]
		w := l.waiters[0]
		ok, err := w.try()
		if !ok && err == nil {
			stuck++
			q.turn = (q.turn + 1) % len(q.ring)
			continue
		}
		stuck = 0
		w.err = err
		if err == nil {
			q.stats.Admitted++
		} else {
			q.stats.Left++
		}
		close(w.done)
		l.waiters = l.waiters[1:]
		q.waiting--
		if len(l.waiters) == 0 {
			q.drop(q.turn)
		} else {
			q.turn = (q.turn + 1) % len(q.ring)
		}
	}
}
