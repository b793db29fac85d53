package vmlink

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"
)

// Listener is the guest's side: it serves sessions on a virtio-serial port
// one after another, for as long as hosts come, and hands out every stream
// any of them opens as an accepted connection.
type Listener struct {
	fd    int
	log   *slog.Logger
	wmu   sync.Mutex // one writer on the port at a time, across sessions
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	// stopped is closed when the loop has let go of the port.
	stopped chan struct{}
}

// Listen serves sessions on the port open at fd (blocking mode: the
// listener reads and writes it with plain system calls).
func Listen(fd int, log *slog.Logger) *Listener {
	l := &Listener{fd: fd, log: log, conns: make(chan net.Conn), done: make(chan struct{}), stopped: make(chan struct{})}
	go l.loop()
	return l
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener. The port stays open: it is the guest's
// only link and is closed when the guest stops.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return portAddr{} }

type portAddr struct{}

func (portAddr) Network() string { return "virtio-serial" }
func (portAddr) String() string  { return "virtio-serial" }

func (l *Listener) closed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

func (l *Listener) loop() {
	defer close(l.stopped)
	for !l.closed() {
		rest, nonce, err := l.waitHello()
		if err != nil {
			l.log.Error("vmlink: port failed", "err", err)
			time.Sleep(time.Second)
			continue
		}
		pc := &portConn{l: l, prefix: rest}
		if _, err := pc.Write(append(append([]byte{}, ackMagic...), nonce...)); err != nil {
			continue
		}
		yc := yamux.DefaultConfig()
		yc.EnableKeepAlive = false // the host watches the guest, not the reverse
		yc.StreamCloseTimeout = time.Minute
		yc.LogOutput = io.Discard
		sess, err := yamux.Server(pc, yc)
		if err != nil {
			l.log.Error("vmlink: session", "err", err)
			continue
		}
		l.log.Info("vmlink: host connected")
		for {
			c, err := sess.Accept()
			if err != nil {
				break
			}
			select {
			case l.conns <- c:
			case <-l.done:
				c.Close()
			}
		}
		pc.end()
		sess.Close()
		l.log.Info("vmlink: host disconnected")
	}
}

// waitHello reads the port until a host's greeting, and returns what
// followed it and its nonce. While no host is connected a read of the
// port returns 0 at once, so it polls.
func (l *Listener) waitHello() (rest, nonce []byte, err error) {
	var buf []byte
	chunk := make([]byte, 4096)
	for !l.closed() {
		n, err := unix.Read(l.fd, chunk)
		if err != nil && !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EAGAIN) {
			return nil, nil, fmt.Errorf("read port: %w", err)
		}
		if n <= 0 {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		buf = append(buf, chunk[:n]...)
		// Answer the last greeting: a host that gave up on an earlier one
		// waits for the answer to its latest.
		if i := lastHello(buf); i >= 0 {
			start := i + len(helloMagic)
			return buf[start+nonceLen:], bytes.Clone(buf[start : start+nonceLen]), nil
		}
		if len(buf) > 2*len(helloMagic)+nonceLen {
			buf = append(buf[:0], buf[len(buf)-len(helloMagic)-nonceLen:]...)
		}
	}
	return nil, nil, net.ErrClosed
}

// lastHello is the index of the last complete greeting in buf, or -1.
func lastHello(buf []byte) int {
	for end := len(buf); end > 0; {
		i := bytes.LastIndex(buf[:end], helloMagic)
		if i < 0 {
			return -1
		}
		if len(buf) >= i+len(helloMagic)+nonceLen {
			return i
		}
		end = i
	}
	return -1
}

// portConn is one session's view of the port. Once the session ends its
// reads and writes fail, so that a writer still blocked in the kernel
// (a guest write waits while no host is connected) cannot send the rest
// of a frame into the next session.
type portConn struct {
	l      *Listener
	prefix []byte
	mu     sync.Mutex
	ended  bool
}

const maxPortWrite = 32 << 10 // what virtio_console takes in one write

func (c *portConn) isEnded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

func (c *portConn) end() {
	c.mu.Lock()
	c.ended = true
	c.mu.Unlock()
}

func (c *portConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	for {
		if c.isEnded() {
			return 0, io.EOF
		}
		n, err := unix.Read(c.l.fd, p)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, io.EOF // the host went away
		}
		return n, nil
	}
}

func (c *portConn) Write(p []byte) (int, error) {
	c.l.wmu.Lock()
	defer c.l.wmu.Unlock()
	written := 0
	for written < len(p) {
		if c.isEnded() {
			return written, io.ErrClosedPipe
		}
		n, err := unix.Write(c.l.fd, p[written:min(len(p), written+maxPortWrite)])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return written, err
		}
		written += n
	}
	return written, nil
}

func (c *portConn) Close() error {
	c.end()
	return nil
}
