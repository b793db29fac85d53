package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// inlineTransport sends an exec (POST /exec with a small body) on a kept
// connection from the calling goroutine: it writes the request and reads
// the answer itself. http.Transport hands every request to a writer
// goroutine and every answer back from a reader goroutine, and on a busy
// node each handoff woke an idle thread of the edge (a futex wake and a
// context switch, costly under virtualisation): a warm exec cost the
// all-in-one server ~20 context switches. Other requests (uploads,
// upgrades to a terminal or tunnel) go through http.Transport.
type inlineTransport struct {
	dial func(ctx context.Context) (net.Conn, error)
	next http.RoundTripper

	mu    sync.Mutex
	idle  []*inlineConn // most recently used last
	dials int           // connections made, for tests
}

// maxInlineBody is the largest request body sent inline: it is read
// whole first, and fits in a socket's buffer, so the write never waits
// for the agent to read.
const maxInlineBody = 64 << 10

// maxInlineIdle bounds the connections kept between execs.
const maxInlineIdle = 16

type inlineConn struct {
	net.Conn
	br *bufio.Reader
}

func (t *inlineTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.URL.Path != "/exec" || req.Header.Get("Upgrade") != "" ||
		req.ContentLength < 0 || req.ContentLength > maxInlineBody {
		return t.next.RoundTrip(req)
	}
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	return t.send(req, body)
}

// send writes req with body on a kept connection (or a new one) and reads
// the answer's header.
func (t *inlineTransport) send(req *http.Request, body []byte) (*http.Response, error) {
	ctx := req.Context()
	c, reused, err := t.get(ctx)
	if err != nil {
		return nil, err
	}
	var head bytes.Buffer
	out := req.Clone(ctx)
	// The body goes with the header: no 100 Continue to wait for (a curl
	// caller's Expect reaches here through the proxies).
	out.Header.Del("Expect")
	out.Body, out.ContentLength = nil, 0
	if len(body) > 0 {
		out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	if err := out.Write(&head); err != nil {
		c.Close()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	if _, err := c.Write(head.Bytes()); err != nil {
		stop()
		c.Close()
		if reused && ctx.Err() == nil {
			// The agent closed the kept connection: it read nothing of
			// this request. Once more, on another.
			return t.send(req, body)
		}
		return nil, t.failed(ctx, err)
	}
	resp, err := readResponse(c.br, out)
	if err != nil {
		stop()
		c.Close()
		return nil, t.failed(ctx, err)
	}
	resp.Request = req
	resp.Body = &inlineBody{t: t, c: c, rc: resp.Body, stop: stop, keepConn: !resp.Close && !req.Close, eof: resp.Body == http.NoBody}
	return resp, nil
}

// readResponse reads the final answer, skipping informational ones
// (1xx, as http.Transport does; an exec is never upgraded).
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil || resp.StatusCode < 100 || resp.StatusCode > 199 {
			return resp, err
		}
	}
}

// readBody reads a request's body, of declared length, whole.
func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	b := make([]byte, req.ContentLength)
	if _, err := io.ReadFull(req.Body, b); err != nil {
		return nil, fmt.Errorf("read request body: %w", err)
	}
	return b, nil
}

func (t *inlineTransport) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// get takes a kept connection the agent has not closed, or dials one.
func (t *inlineTransport) get(ctx context.Context) (*inlineConn, bool, error) {
	for {
		t.mu.Lock()
		n := len(t.idle)
		if n == 0 {
			t.dials++
			t.mu.Unlock()
			break
		}
		c := t.idle[n-1]
		t.idle = t.idle[:n-1]
		t.mu.Unlock()
		if open(c) {
			return c, true, nil
		}
		c.Close()
	}
	nc, err := t.dial(ctx)
	if err != nil {
		return nil, false, err
	}
	return &inlineConn{Conn: nc, br: bufio.NewReader(nc)}, false, nil
}

// open reports whether a kept connection is still open and has nothing
// unread: a peek that would block.
func open(c *inlineConn) bool {
	if c.br.Buffered() > 0 {
		return false
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var b [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		alive = errors.Is(err, unix.EAGAIN)
		return true
	}); err != nil {
		return false
	}
	return alive
}

func (t *inlineTransport) put(c *inlineConn) {
	t.mu.Lock()
	if len(t.idle) < maxInlineIdle {
		t.idle = append(t.idle, c)
		c = nil
	}
	t.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

func (t *inlineTransport) closeIdle() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
}

// inlineBody is an answer's body: read to its end, its connection is
// kept for the next exec; closed before, the connection is closed (which
// tells the agent its caller left: a running command is killed).
type inlineBody struct {
	t    *inlineTransport
	c    *inlineConn
	rc   io.ReadCloser
	stop func() bool // of the context's AfterFunc
	// keepConn: neither side asked to close the connection after it.
	keepConn bool
	mu       sync.Mutex
	eof      bool
	done     bool
}

func (b *inlineBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.mu.Lock()
		b.eof = true
		b.mu.Unlock()
	}
	return n, err
}

func (b *inlineBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return nil
	}
	b.done = true
	canceled := !b.stop()
	if b.eof && b.keepConn && !canceled {
		b.t.put(b.c)
		return nil
	}
	return b.c.Close()
}
