package agent

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// reaperActive guards the one reaper a process may have: wait4(-1) in two
// places would hand each other's exit statuses to the wrong waiter.
var reaperActive atomic.Bool

// child is a process the agent started. It leads its own process group.
type child struct {
	pid    int
	done   chan struct{}   // closed once reaped
	status unix.WaitStatus // valid after done is closed
}

// reaper is the agent's only caller of wait4. It reaps every child,
// including orphans reparented to it, and hands the statuses of the ones it
// started to their waiters.
type reaper struct {
	sigs chan os.Signal

	// mu is held across fork and registration, so a child that exits
	// before it is registered is still found when its status is reaped.
	mu      sync.Mutex
	live    map[int]*child
	stopped bool // no new children: the agent is shutting down
	held    bool // no new children: the agent is resetting
}

func newReaper() (*reaper, error) {
	if !reaperActive.CompareAndSwap(false, true) {
		return nil, errors.New("start reaper: a reaper already runs in this process")
	}
	r := &reaper{sigs: make(chan os.Signal, 1), live: make(map[int]*child)}
	signal.Notify(r.sigs, unix.SIGCHLD)
	go r.loop()
	return r, nil
}

func (r *reaper) loop() {
	r.reap() // children that exited before Notify took effect
	for range r.sigs {
		r.reap()
	}
}

// reap collects every exited child. SIGCHLDs coalesce, so one signal may
// stand for many exits; it loops until none is left.
func (r *reaper) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.mu.Lock()
		c := r.live[pid]
		delete(r.live, pid)
		r.mu.Unlock()
		if c != nil {
			c.status = ws
			close(c.done)
		}
		// Unknown pids are orphans reparented to us: reaped, forgotten.
	}
}

// start forks and execs a process in its own process group and registers
// it before anyone can reap it. Failures to exec are *startError.
//
// With fork, the process is forked by fork (a confined thread) instead
// of the calling thread.
func (r *reaper) start(argv0 string, argv []string, attr *syscall.ProcAttr, fork forkFunc) (*child, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || r.held {
		return nil, fmt.Errorf("start %s: agent is shutting down or resetting: %w", argv0, errdefs.ErrUnavailable)
	}
	if fork == nil {
		fork = syscall.ForkExec
	}
	pid, err := fork(argv0, argv, attr)
	if errors.As(err, new(*confineError)) {
		return nil, err
	}
	if err != nil {
		return nil, execError(argv0, err)
	}
	c := &child{pid: pid, done: make(chan struct{})}
	r.live[pid] = c
	return c, nil
}

// hold refuses new children while on is true. Taking the lock waits for
// a fork in flight.
func (r *reaper) hold(on bool) {
	r.mu.Lock()
	r.held = on
	r.mu.Unlock()
}

// stop refuses new children and returns the ones still running.
func (r *reaper) stop() []*child {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	kids := make([]*child, 0, len(r.live))
	for _, c := range r.live {
		kids = append(kids, c)
	}
	return kids
}

func (r *reaper) close() {
	signal.Stop(r.sigs)
	close(r.sigs)
	reaperActive.Store(false)
}

// signalGroup sends sig to the process group c leads, unless c has been
// reaped: once the group is empty its id may be reused.
func (c *child) signalGroup(sig unix.Signal) {
	select {
	case <-c.done:
	default:
		_ = unix.Kill(-c.pid, sig) // ESRCH: gone already
	}
}
