package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/dsec-project/dsec/client"
)

// sandboxPortForward is `dsec sandbox port-forward ID [LOCAL:]REMOTE`:
// every connection to 127.0.0.1:LOCAL is carried to port REMOTE inside the
// sandbox over a WebSocket, whatever its protocol, until interrupted.
func sandboxPortForward(ctx context.Context, fs *flag.FlagSet, newClient func() *client.Client, args []string) error {
	addr := fs.String("address", "127.0.0.1", "local address to listen on")
	pos, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return errors.New("usage: dsec sandbox port-forward [--address A] ID [LOCAL:]REMOTE")
	}
	id := pos[0]
	local, remote, ok := strings.Cut(pos[1], ":")
	if !ok {
		local, remote = pos[1], pos[1]
	}
	rport, err := strconv.Atoi(remote)
	if err != nil || rport < 1 || rport > 65535 {
		return fmt.Errorf("remote port %q is not a TCP port", remote)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(*addr, local))
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Fprintf(os.Stderr, "forwarding %s -> %s:%d\n", l.Addr(), id, rport)
	c := newClient()
	return forward(ctx, l, "port-forward", func(ctx context.Context) (net.Conn, error) { return c.DialPort(ctx, id, rport) })
}

// forward carries every connection accepted on l to a connection from dial
// until ctx ends; what names the command in its errors.
func forward(ctx context.Context, l net.Listener, what string, dial func(context.Context) (net.Conn, error)) error {
	go func() { <-ctx.Done(); l.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			up, err := dial(ctx)
			if err != nil {
				fmt.Fprintf(os.Stderr, "dsec: %s: %v\n", what, err)
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(up, conn); done <- struct{}{} }()
			go func() { _, _ = io.Copy(conn, up); done <- struct{}{} }()
			select {
			case <-done:
			case <-ctx.Done():
			}
		}()
	}
}
