package agent

import (
	"context"
	"net"
	"net/http"
	"sync"

	"golang.org/x/sys/unix"
)

// fdListener accepts unix connections that may carry file descriptors
// (SCM_RIGHTS) with their bytes: how the edge hands the agent a new root
// file system on reset. Other connections (vsock, TCP) pass unchanged.
type fdListener struct{ net.Listener }

func (l fdListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if uc, ok := c.(*net.UnixConn); ok && err == nil {
		return &fdConn{UnixConn: uc}, nil
	}
	return c, err
}

// fdConn keeps the descriptors that arrive on a connection until a
// handler takes them; the rest are closed with the connection.
type fdConn struct {
	*net.UnixConn
	mu  sync.Mutex
	fds []int
}

// maxFDs bounds the descriptors taken from one read; the kernel closes
// any beyond the control buffer (MSG_CTRUNC).
const maxFDs = 4

func (c *fdConn) Read(b []byte) (int, error) {
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	// Go receives with MSG_CMSG_CLOEXEC: no descriptor leaks into a child.
	n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr == nil {
			for _, m := range msgs {
				if fds, err := unix.ParseUnixRights(&m); err == nil {
					c.mu.Lock()
					c.fds = append(c.fds, fds...)
					c.mu.Unlock()
				}
			}
		}
	}
	if n < 0 {
		// ReadMsgUnix passes on the syscall's -1 with an error; a Reader
		// must not (bufio panics on it).
		n = 0
	}
	return n, err
}

// take hands the received descriptors to the caller, who closes them.
func (c *fdConn) take() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	fds := c.fds
	c.fds = nil
	return fds
}

func (c *fdConn) Close() error {
	for _, fd := range c.take() {
		unix.Close(fd)
	}
	return c.UnixConn.Close()
}

type connKey struct{}

// connContext lets handlers find their connection (http.Server.ConnContext).
func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// receivedFDs returns the descriptors that came with the request's
// connection so far.
func receivedFDs(r *http.Request) []int {
	if c, ok := r.Context().Value(connKey{}).(*fdConn); ok {
		return c.take()
	}
	return nil
}
