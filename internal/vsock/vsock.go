// Package vsock is a minimal AF_VSOCK listener and dialer, enough for the
// host to reach an agent inside a microVM without a multiplexer: the
// standard library's net package does not know the address family. It
// must never be used for anything but stream sockets.
package vsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Addr is a vsock address.
type Addr struct{ CID, Port uint32 }

// Network implements net.Addr.
func (Addr) Network() string { return "vsock" }

func (a Addr) String() string { return fmt.Sprintf("vsock:%d:%d", a.CID, a.Port) }

// Listener accepts vsock connections.
type Listener struct {
	f    *os.File
	addr Addr
}

// Listen listens on port of any local CID.
func Listen(port uint32) (*Listener, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock bind %d: %w", port, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock listen %d: %w", port, err)
	}
	return &Listener{f: os.NewFile(uintptr(fd), "vsock-listener"), addr: Addr{unix.VMADDR_CID_ANY, port}}, nil
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	rc, err := l.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var (
		nfd  int
		sa   unix.Sockaddr
		aerr error
	)
	err = rc.Read(func(fd uintptr) bool {
		nfd, sa, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		return !errors.Is(aerr, unix.EAGAIN)
	})
	if err != nil {
		if errors.Is(err, os.ErrClosed) {
			return nil, net.ErrClosed
		}
		return nil, err
	}
	if aerr != nil {
		return nil, fmt.Errorf("vsock accept: %w", aerr)
	}
	remote := Addr{}
	if vm, ok := sa.(*unix.SockaddrVM); ok {
		remote = Addr{vm.CID, vm.Port}
	}
	return &Conn{File: os.NewFile(uintptr(nfd), "vsock"), local: l.addr, remote: remote}, nil
}

// Close implements net.Listener.
func (l *Listener) Close() error { return l.f.Close() }

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return l.addr }

// Dial connects to port of the guest cid.
func Dial(ctx context.Context, cid, port uint32) (*Conn, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket: %w", err)
	}
	err = unix.Connect(fd, &unix.SockaddrVM{CID: cid, Port: port})
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock connect %d:%d: %w", cid, port, err)
	}
	f := os.NewFile(uintptr(fd), "vsock")
	c := &Conn{File: f, remote: Addr{cid, port}}
	if errors.Is(err, unix.EINPROGRESS) {
		if dl, ok := ctx.Deadline(); ok {
			f.SetWriteDeadline(dl)
		}
		stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(time.Now()) })
		rc, _ := f.SyscallConn()
		var cerr error
		first := true
		werr := rc.Write(func(fd uintptr) bool {
			if first { // wait until the connect completes
				first = false
				return false
			}
			v, gerr := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
			if gerr != nil {
				cerr = gerr
			} else if v != 0 {
				cerr = unix.Errno(v)
			}
			return true
		})
		stop()
		f.SetWriteDeadline(time.Time{})
		if werr == nil {
			werr = cerr
		}
		if werr != nil {
			f.Close()
			return nil, fmt.Errorf("vsock connect %d:%d: %w", cid, port, werr)
		}
	}
	return c, nil
}

// Conn is a vsock stream connection.
type Conn struct {
	*os.File
	local, remote Addr
}

// LocalAddr implements net.Conn.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr implements net.Conn.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }
