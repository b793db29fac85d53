package microvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/guestinit"
	"github.com/dsec-project/dsec/internal/vmlink"
	"github.com/dsec-project/dsec/internal/vsock"
)

// agentVsockPort is the port the agent listens on inside a guest reached
// over vsock.
const agentVsockPort = 1024

// link is the host's way to the agent of one VM. Over vsock every Dial is
// a connection of its own; over the serial port there is one connection
// (QEMU serves one client on the port's socket) carrying a vmlink session,
// made on first use and again whenever it has ended (the guest rebooted,
// the VM was reset, a ping went unanswered).
type link struct {
	m   *Machine
	cfg vmlink.ClientConfig
	// paused is set while the VM is paused on purpose: its silence is not
	// a hang.
	paused atomic.Bool

	mu   sync.Mutex
	sess *yamux.Session
}

func newLink(m *Machine, cfg vmlink.ClientConfig) *link {
	l := &link{m: m, cfg: cfg}
	l.cfg.Paused = l.paused.Load
	return l
}

// dial opens a connection to the agent.
func (l *link) dial(ctx context.Context) (net.Conn, error) {
	if l.m.Transport == guestinit.TransportVsock {
		c, err := vsock.Dial(ctx, l.m.CID, agentVsockPort)
		if err != nil {
			return nil, fmt.Errorf("dial agent of %s: %w: %w", l.m.ID, err, errdefs.ErrUnavailable)
		}
		return c, nil
	}
	for attempt := 0; ; attempt++ {
		sess, err := l.session(ctx)
		if err != nil {
			return nil, fmt.Errorf("dial agent of %s: %w: %w", l.m.ID, err, errdefs.ErrUnavailable)
		}
		c, err := sess.Open()
		if err == nil {
			return c, nil
		}
		l.drop(sess)
		if attempt > 0 || ctx.Err() != nil {
			return nil, fmt.Errorf("dial agent of %s: %w: %w", l.m.ID, err, errdefs.ErrUnavailable)
		}
	}
}

// session returns the live session, greeting the guest anew if needed.
// The lock is held across the handshake: a second caller waits for it
// rather than fighting over QEMU's single-client socket.
func (l *link) session(ctx context.Context) (*yamux.Session, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess != nil && !l.sess.IsClosed() {
		return l.sess, nil
	}
	// The HTTP transport dials with a context that outlives the request:
	// bound the greeting, or a guest that never answers holds it forever.
	timeout := l.cfg.Timeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// A guest whose host went away and came back at once (a VMM that was
	// stopped, then continued) may not have seen the hang-up, and take
	// the greeting for bytes of its old session, which then fails. Greet
	// again, on a new connection, after a growing wait.
	var (
		sess *yamux.Session
		err  error
	)
	for attempt := time.Second; ; attempt *= 2 {
		actx, acancel := context.WithTimeout(ctx, attempt)
		sess, err = l.greet(actx)
		acancel()
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	l.sess = sess
	return sess, nil
}

func (l *link) greet(ctx context.Context) (*yamux.Session, error) {
	c, err := DialUnix(ctx, filepath.Join(l.m.Dir, AgentSocket))
	if err != nil {
		return nil, err
	}
	return vmlink.Client(ctx, c, l.cfg)
}

// drop ends sess if it is still the current session.
func (l *link) drop(sess *yamux.Session) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess == sess {
		l.sess = nil
	}
	sess.Close()
}

// close ends the session; the next dial makes a new one.
func (l *link) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess != nil {
		l.sess.Close()
		l.sess = nil
	}
}

// alive reports whether the guest answers on the link now, within ctx.
func (l *link) alive(ctx context.Context) error {
	if l.m.Transport == guestinit.TransportVsock {
		c, err := l.dial(ctx)
		if err != nil {
			return err
		}
		return c.Close()
	}
	sess, err := l.session(ctx)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { _, err := sess.Ping(); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			l.drop(sess)
		}
		return err
	case <-ctx.Done():
		l.drop(sess)
		return errors.Join(ctx.Err(), errdefs.ErrUnavailable)
	}
}
