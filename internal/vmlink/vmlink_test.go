package vmlink

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pipe is a stand-in for a virtio-serial port: a socket pair whose guest
// end is a blocking fd, as the port is.
func pipe(t *testing.T) (host net.Conn, guestFD int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "host")
	host, err = net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close(); unix.Close(fds[1]) })
	return host, fds[1]
}

// echo serves l: every connection gets back what it sends.
func echo(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() { io.Copy(c, c); c.Close() }()
	}
}

func TestLink(t *testing.T) {
	tests := []struct {
		name                string
		staleToGuest, stale string // bytes in the pipe before each side's greeting
	}{
		{"clean pipe", "", ""},
		{"stale bytes to the guest", "half a frame of an old session\x00\x01", ""},
		{"stale bytes to the host", "", "output of an old session " + string(ackMagic[:5])},
		{"stale bytes both ways", "half a frame\x00\x01", "output of an old session"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host, gfd := pipe(t)
			if tt.stale != "" {
				unix.Write(gfd, []byte(tt.stale))
			}
			if tt.staleToGuest != "" {
				host.Write([]byte(tt.staleToGuest))
			}
			l := Listen(gfd, slog.New(slog.DiscardHandler))
			t.Cleanup(func() {
				// Wake the listener's blocked read, and let it go of the
				// fd before the fd number is reused.
				l.Close()
				unix.Shutdown(gfd, unix.SHUT_RDWR)
				<-l.stopped
			})
			go echo(l)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			sess, err := Client(ctx, host, ClientConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			var wg sync.WaitGroup
			errs := make(chan error, 20)
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := sess.Open()
					if err != nil {
						errs <- err
						return
					}
					defer c.Close()
					msg := fmt.Sprintf("stream %d %0200000d", i, i) // more than a window
					go c.Write([]byte(msg))
					got := make([]byte, len(msg))
					if _, err := io.ReadFull(c, got); err != nil {
						errs <- err
					} else if string(got) != msg {
						errs <- fmt.Errorf("stream %d: data mixed up", i)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

func TestClientGivesUp(t *testing.T) {
	host, _ := pipe(t) // nobody answers
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := Client(ctx, host, ClientConfig{}); err == nil {
		t.Fatal("handshake with a silent guest succeeded")
	}
}

func TestLastHello(t *testing.T) {
	nonce := "0123456789abcdef"
	h := string(helloMagic)
	tests := []struct {
		name, buf string
		want      int
	}{
		{"none", "stale bytes", -1},
		{"one", "xx" + h + nonce, 2},
		{"the last of two", h + nonce + h + nonce + "rest", len(h) + len(nonce)},
		{"a later one still arriving", h + nonce + h + nonce[:3], 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := lastHello([]byte(tt.buf)); got != tt.want {
				t.Fatalf("lastHello = %d, want %d", got, tt.want)
			}
		})
	}
}
