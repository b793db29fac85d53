package microvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/dsec-project/dsec/internal/backend"
)

// ListenUnix creates a listening unix socket at path and returns it as a
// file to hand to a VMM process. The socket file stays after the caller
// closes its copy. Long paths (a sockaddr_un holds 108 bytes) go through
// /proc/self/fd.
func ListenUnix(path string) (*os.File, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	short, done, err := backend.ShortPath(path)
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
	short, done, err := backend.ShortPath(path)
	if err != nil {
		return nil, err
	}
	defer done()
	var d net.Dialer
	return d.DialContext(ctx, "unix", short)
}
