package microvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ListenUnix creates a listening unix socket at path and returns it as a
// file to hand to a VMM process. The socket file stays after the caller
// closes its copy. Long paths (a sockaddr_un holds 108 bytes) go through
// /proc/self/fd.
func ListenUnix(path string) (*os.File, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	short, done, err := shortPath(path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	defer done()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: short, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	l.Close()
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return f, nil
}

// DialUnix connects to the unix socket at path, however long the path.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	short, done, err := shortPath(path)
	if err != nil {
		return nil, err
	}
	defer done()
	var d net.Dialer
	return d.DialContext(ctx, "unix", short)
}

// shortPath returns a name for path that fits in a sockaddr_un: the path
// itself if short, else the name through an O_PATH descriptor of its
// directory, valid until done is called.
func shortPath(path string) (short string, done func(), err error) {
	if len(path) < 100 {
		return path, func() {}, nil
	}
	fd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", fd, filepath.Base(path)), func() { unix.Close(fd) }, nil
}
