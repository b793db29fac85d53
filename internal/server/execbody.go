package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// maxExecBody bounds an exec body: the largest stdin the agent takes,
// base64 and all.
const maxExecBody = 96 << 20

// memExecBody is how much of an exec body is kept in memory; the rest of
// a larger one goes to a temporary file, so that large stdins do not pile
// up in the control plane's memory.
const memExecBody = 1 << 20

// execBody is an exec request body read whole, so that the control plane
// can look into it (does it carry a trajectory?) before passing it on.
type execBody struct {
	mem  []byte
	file *os.File // the whole body, when over memExecBody
	size int64
}

func readExecBody(r *http.Request, tmpDir string) (*execBody, error) {
	body := http.MaxBytesReader(nil, r.Body, maxExecBody)
	head, err := io.ReadAll(io.LimitReader(body, memExecBody+1))
	if err == nil && len(head) <= memExecBody {
		return &execBody{mem: head, size: int64(len(head))}, nil
	}
	var f *os.File
	if err == nil {
		if f, err = os.CreateTemp(tmpDir, "exec-body-"); err == nil {
			os.Remove(f.Name()) // nothing to clean up even if we die
			var n int64
			if _, err = f.Write(head); err == nil {
				n, err = io.Copy(f, body)
			}
			if err == nil {
				_, err = f.Seek(0, io.SeekStart)
			}
			if err == nil {
				return &execBody{file: f, size: int64(len(head)) + n}, nil
			}
			f.Close()
		}
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, fmt.Errorf("exec body over %d bytes: %w", maxExecBody, errdefs.ErrTooLarge)
	}
	return nil, errdefs.Invalid("read exec body: %v", err)
}

// contains reports whether the body holds any of subs (each shorter than
// 64 bytes).
func (b *execBody) contains(subs ...string) bool {
	if b.file == nil {
		for _, s := range subs {
			if bytes.Contains(b.mem, []byte(s)) {
				return true
			}
		}
		return false
	}
	defer b.file.Seek(0, io.SeekStart)
	buf := make([]byte, 64<<10)
	keep := 0 // bytes carried over, so a match across reads is found
	for {
		n, err := b.file.Read(buf[keep:])
		window := buf[:keep+n]
		for _, s := range subs {
			if bytes.Contains(window, []byte(s)) {
				return true
			}
		}
		if err != nil {
			return false
		}
		keep = min(len(window), 64)
		copy(buf, window[len(window)-keep:])
	}
}

// all returns the whole body.
func (b *execBody) all() ([]byte, error) {
	if b.file == nil {
		return b.mem, nil
	}
	defer b.file.Seek(0, io.SeekStart)
	return io.ReadAll(b.file)
}

// reader returns the body to pass on.
func (b *execBody) reader() io.ReadCloser {
	if b.file == nil {
		return io.NopCloser(bytes.NewReader(b.mem))
	}
	return b.file
}

func (b *execBody) close() {
	if b.file != nil {
		b.file.Close()
	}
}
