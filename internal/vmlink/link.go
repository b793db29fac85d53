// Package vmlink carries many connections to a microVM's agent over one
// byte stream: a virtio-serial port whose host end is a unix socket, where
// the host has no vsock. The stream is multiplexed with yamux (streams with
// their own flow control, so one slow reader never stalls another), after
// a handshake that lets either side start over cleanly when the other
// reconnects: a host that was killed mid-frame, or a guest that wrote while
// no host listened, leaves stale bytes in the pipe, and each side discards
// everything up to the other's greeting.
//
// The host (Client) greets with a random nonce and waits for the guest to
// echo it; the guest (Listener) waits for a greeting, answers it, and
// serves a new session for it. This package must never block a guest
// write of one session behind another session's: a write from a session
// that has ended fails instead of reaching the next host.
package vmlink

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"
)

var (
	helloMagic = []byte("DSEC-LINK-HELLO\x00")
	ackMagic   = []byte("DSEC-LINK-ACK!!\x00")
)

const nonceLen = 16

// ClientConfig tunes the host's side.
type ClientConfig struct {
	// KeepAlive is how often the host pings the guest; a ping not answered
	// within Timeout ends the session (a hung guest). Zero: 5 s and 15 s.
	KeepAlive, Timeout time.Duration
	// Paused, if set, reports that the guest is stopped on purpose: it is
	// not pinged then, so requests in flight wait for it to go on.
	Paused func() bool
}

// Client greets the guest over conn and returns the multiplexed session.
// ctx bounds the handshake. On error conn is closed.
func Client(ctx context.Context, conn net.Conn, cfg ClientConfig) (*yamux.Session, error) {
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 5 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 15 * time.Second
	}
	nonce := make([]byte, nonceLen)
	rand.Read(nonce)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	rest, err := func() ([]byte, error) {
		if _, err := conn.Write(append(append([]byte{}, helloMagic...), nonce...)); err != nil {
			return nil, err
		}
		return scanFor(conn, append(append([]byte{}, ackMagic...), nonce...))
	}()
	if !stop() || err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("vmlink handshake: %w", ctx.Err())
		}
		return nil, fmt.Errorf("vmlink handshake: %w", err)
	}
	conn.SetDeadline(time.Time{})
	yc := yamux.DefaultConfig()
	yc.EnableKeepAlive = false // watch pings, minding pauses
	yc.ConnectionWriteTimeout = cfg.Timeout
	yc.StreamCloseTimeout = time.Minute
	yc.LogOutput = io.Discard
	sess, err := yamux.Client(&prefixConn{Conn: conn, prefix: rest}, yc)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("vmlink session: %w", err)
	}
	go watch(sess, cfg)
	return sess, nil
}

// watch pings the guest every cfg.KeepAlive, unless it is paused, and
// ends the session when a ping is not answered within cfg.Timeout.
func watch(sess *yamux.Session, cfg ClientConfig) {
	tick := time.NewTicker(cfg.KeepAlive)
	defer tick.Stop()
	for {
		select {
		case <-sess.CloseChan():
			return
		case <-tick.C:
		}
		if cfg.Paused != nil && cfg.Paused() {
			continue
		}
		done := make(chan error, 1)
		go func() { _, err := sess.Ping(); done <- err }()
		t := time.NewTimer(cfg.Timeout)
		select {
		case err := <-done:
			t.Stop()
			if err == nil {
				continue
			}
		case <-t.C:
			if cfg.Paused != nil && cfg.Paused() {
				continue // paused while the ping was out
			}
		case <-sess.CloseChan():
			t.Stop()
			return
		}
		sess.Close()
		return
	}
}

// scanFor reads r until it has seen want, and returns the bytes read
// after it. Bytes before it are stale and dropped.
func scanFor(r io.Reader, want []byte) ([]byte, error) {
	var buf []byte
	chunk := make([]byte, 4096)
	for {
		n, err := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if i := bytes.Index(buf, want); i >= 0 {
			return buf[i+len(want):], nil
		}
		if len(buf) > len(want) { // keep only what may begin a match
			buf = append(buf[:0], buf[len(buf)-len(want)+1:]...)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// prefixConn replays bytes read past the handshake before reading on.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
