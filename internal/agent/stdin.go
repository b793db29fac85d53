package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Limits of writes to a background process's stdin.
const (
	// MaxStdinWrite bounds the body of one POST /procs/{id}/stdin.
	MaxStdinWrite = 1 << 20
	// stdinWriteTimeout bounds how long a write waits for a process that
	// does not read its stdin (its pipe or terminal buffer is full).
	stdinWriteTimeout = 30 * time.Second
)

// input is the kept-open stdin of a background process started with
// stdin_open: the write end of its stdin pipe, or its terminal's master
// side. The command's drain closes the file when the process has exited;
// close closes a pipe sooner.
type input struct {
	turn   chan struct{} // a token per writer, so that each body lands whole
	f      *os.File
	pty    bool
	closed atomic.Bool
}

func newInput(f *os.File, pty bool) *input {
	return &input{turn: make(chan struct{}, 1), f: f, pty: pty}
}

// errInputClosed is a write after close.
var errInputClosed = errors.New("stdin is closed")

// acquire waits for the writers before (the initial stdin among them) up
// to stdinWriteTimeout or until ctx ends.
func (in *input) acquire(ctx context.Context) error {
	t := time.NewTimer(stdinWriteTimeout)
	defer t.Stop()
	select {
	case in.turn <- struct{}{}:
		return nil
	case <-t.C:
		return os.ErrDeadlineExceeded
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (in *input) release() { <-in.turn }

// write writes data whole, giving up after stdinWriteTimeout or when ctx
// ends, and says how much went.
func (in *input) write(ctx context.Context, data []byte) (int, error) {
	if err := in.acquire(ctx); err != nil {
		return 0, err
	}
	defer in.release()
	if in.closed.Load() {
		return 0, errInputClosed
	}
	if err := in.f.SetWriteDeadline(time.Now().Add(stdinWriteTimeout)); err != nil {
		return 0, err
	}
	stop := context.AfterFunc(ctx, func() { _ = in.f.SetWriteDeadline(time.Now()) })
	defer stop()
	return in.f.Write(data)
}

// close ends the input. A pipe is closed at once (a write blocked on it
// fails), so its reader sees end of file. A terminal stays open (its
// master side carries the output too): close types ^D (EOT) after the
// writes before it, the end of file of a terminal in canonical mode at the
// start of a line.
func (in *input) close(ctx context.Context) error {
	if in.closed.Swap(true) {
		return nil
	}
	if !in.pty {
		return in.f.Close()
	}
	if err := in.acquire(ctx); err != nil {
		return err
	}
	defer in.release()
	_ = in.f.SetWriteDeadline(time.Now().Add(stdinWriteTimeout))
	_, err := in.f.Write([]byte{4})
	return err
}

func (in *input) isOpen() bool { return in != nil && !in.closed.Load() }

// stdinTarget is the process a stdin request names, with its input, or
// the error that says why it takes none.
func (s *Server) stdinTarget(w http.ResponseWriter, r *http.Request, what string) (*proc, bool) {
	p := s.proc(w, r)
	if p == nil {
		return nil, false
	}
	var err error
	switch {
	case p.in == nil:
		err = fmt.Errorf("%s stdin of process %s: it was not started with stdin_open: %w", what, p.id, errdefs.ErrFailedPrecondition)
	case p.child == nil || isClosed(p.child.done):
		err = fmt.Errorf("%s stdin of process %s: it has exited: %w", what, p.id, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		s.writeError(w, r, err)
		return nil, false
	}
	return p, true
}

// handleStdin writes the request body to a background process's stdin.
func (s *Server) handleStdin(w http.ResponseWriter, r *http.Request) {
	p, ok := s.stdinTarget(w, r, "write to")
	if !ok {
		return
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxStdinWrite))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = fmt.Errorf("stdin body over %d bytes (send more in several writes): %w", MaxStdinWrite, errdefs.ErrTooLarge)
		} else {
			err = errdefs.Invalid("read stdin body: %v", err)
		}
		s.writeError(w, r, err)
		return
	}
	n, err := p.in.write(r.Context(), data)
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
		return
	case errors.Is(err, errInputClosed):
		err = fmt.Errorf("write to stdin of process %s: its stdin is closed: %w", p.id, errdefs.ErrFailedPrecondition)
	case errors.Is(err, syscall.EPIPE), errors.Is(err, os.ErrClosed), errors.Is(err, syscall.EIO):
		// No reader is left (it exited, or closed its stdin), or drain
		// closed our end; on a terminal, EIO once its side is gone.
		err = fmt.Errorf("write to stdin of process %s: no longer read (it exited or closed its stdin); %d of %d bytes written: %w",
			p.id, n, len(data), errdefs.ErrFailedPrecondition)
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("write to stdin of process %s: it did not read its stdin within %s; %d of %d bytes written: %w",
			p.id, stdinWriteTimeout, n, len(data), errdefs.ErrUnavailable)
	default:
		err = fmt.Errorf("write to stdin of process %s: %d of %d bytes written: %w", p.id, n, len(data), err)
	}
	s.writeError(w, r, err)
}

// handleCloseStdin closes a background process's stdin.
func (s *Server) handleCloseStdin(w http.ResponseWriter, r *http.Request) {
	p, ok := s.stdinTarget(w, r, "close")
	if !ok {
		return
	}
	if err := p.in.close(r.Context()); err != nil && !errors.Is(err, os.ErrClosed) {
		s.writeError(w, r, fmt.Errorf("close stdin of process %s: %w", p.id, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleResize sets the window size of a background process's terminal;
// the kernel sends SIGWINCH to its foreground process group.
func (s *Server) handleResize(w http.ResponseWriter, r *http.Request) {
	p := s.proc(w, r)
	if p == nil {
		return
	}
	var size api.TTYSize
	if err := decodeJSON(w, r, &size, 1<<10); err != nil {
		s.writeError(w, r, err)
		return
	}
	var err error
	switch {
	case p.pty == nil:
		err = fmt.Errorf("resize process %s: it does not run on a terminal (start it with tty): %w", p.id, errdefs.ErrFailedPrecondition)
	case p.child == nil || isClosed(p.child.done):
		err = fmt.Errorf("resize process %s: it has exited: %w", p.id, errdefs.ErrFailedPrecondition)
	default:
		err = setSize(p.pty, size.Rows, size.Cols)
		if err != nil && isClosed(p.child.done) {
			// It exited meanwhile, and drain closed the terminal.
			err = fmt.Errorf("resize process %s: it has exited: %w", p.id, errdefs.ErrFailedPrecondition)
		}
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
