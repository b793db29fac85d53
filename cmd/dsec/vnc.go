package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"

	"github.com/dsec-project/dsec/client"
)

// sandboxVNC is `dsec sandbox vnc ID [LOCAL]`: every connection to
// 127.0.0.1:LOCAL (default 5900) is carried to the sandbox's VNC server
// over its VNC WebSocket, so any VNC viewer (vncviewer 127.0.0.1:5900) can
// watch and take over the screen, until interrupted.
func sandboxVNC(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	addr := fs.String("address", "127.0.0.1", "local address to listen on")
	pos, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 && len(pos) != 2 {
		return errors.New("usage: dsec sandbox vnc [--address A] ID [LOCAL]")
	}
	id, local := pos[0], "5900"
	if len(pos) == 2 {
		local = pos[1]
	}
	c := newClient()
	// Refused at once if the sandbox has no VNC server, not at the first
	// viewer's connection.
	probe, err := c.DialVNC(ctx, id)
	if err != nil {
		return err
	}
	probe.Close()
	l, err := net.Listen("tcp", net.JoinHostPort(*addr, local))
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Fprintf(os.Stderr, "VNC of %s on %s\n", id, l.Addr())
	return forward(ctx, l, "vnc", func(ctx context.Context) (net.Conn, error) { return c.DialVNC(ctx, id) })
}
