package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/dsec-project/dsec/api"
)

// Output is coalesced into events of up to coalesceBytes, sent no later
// than coalesceDelay after their first byte arrived.
const (
	coalesceDelay = 10 * time.Millisecond
	coalesceBytes = 32 << 10
)

const (
	streamStdout = iota
	streamStderr
)

type chunk struct {
	stream int
	data   []byte
}

// streamSink passes a stream's first limit bytes on to the event writer,
// waiting for it (a slow client slows the command), and counts the rest
// without waiting for anyone.
type streamSink struct {
	stream  int
	ch      chan<- chunk
	gone    <-chan struct{} // the request is over: nobody reads ch
	left    int
	dropped int64
}

func (s *streamSink) Write(p []byte) (int, error) {
	k := min(len(p), s.left)
	s.left -= k
	s.dropped += int64(len(p) - k)
	if k > 0 {
		select {
		case s.ch <- chunk{s.stream, bytes.Clone(p[:k])}:
		case <-s.gone:
		}
	}
	return len(p), nil
}

// execStream runs a command and streams its output as NDJSON events,
// ending with its exit.
func (s *Server) execStream(w http.ResponseWriter, r *http.Request, spec *execSpec) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	chunks := make(chan chunk, 4)
	stdout := &streamSink{stream: streamStdout, ch: chunks, gone: ctx.Done(), left: spec.maxOutput}
	stderr := &streamSink{stream: streamStderr, ch: chunks, gone: ctx.Done(), left: spec.maxOutput}
	c, err := s.start(spec, stdout, stderr)
	var se *startError
	if err != nil && !errors.As(err, &se) {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", ndjson)
	w.WriteHeader(http.StatusOK)
	ew := &eventWriter{enc: json.NewEncoder(w), rc: http.NewResponseController(w)}
	var res api.ExecResult
	if se != nil {
		var msg []byte
		res, msg = se.result()
		ew.add(chunk{streamStderr, msg})
		ew.flush()
	} else {
		go func() {
			res = c.result(c.wait(ctx, spec.timeout))
			close(chunks) // the pumps are done: nothing sends any more
		}()
		ew.run(chunks, cancel)
		setDropped(&res, stdout.dropped, stderr.dropped)
	}
	ew.end()
	ew.write(api.ExecEvent{Exit: &res})
	logExec(r, spec, c, &res)
}

// eventWriter turns chunks into NDJSON events. It never splits a UTF-8
// character between two events: an incomplete one at the end of a chunk
// waits for the rest in carry.
type eventWriter struct {
	enc     *json.Encoder
	rc      *http.ResponseController
	err     error // the first write error: the client is gone
	pending []byte
	stream  int // of pending
	carry   [2][]byte
	timer   *time.Timer
}

// run writes chunks until the channel is closed. On a write error it calls
// gone (which should end the command) and keeps draining.
func (e *eventWriter) run(chunks <-chan chunk, gone func()) {
	e.timer = time.NewTimer(time.Hour)
	e.timer.Stop()
	defer e.timer.Stop()
	for {
		select {
		case c, ok := <-chunks:
			if !ok {
				return
			}
			e.add(c)
		case <-e.timer.C:
			e.flush()
		}
		if e.err != nil {
			gone()
		}
	}
}

func (e *eventWriter) add(c chunk) {
	if len(e.pending) > 0 && c.stream != e.stream {
		e.flush() // keep the order of stdout and stderr as read
	}
	if len(e.pending) == 0 && e.timer != nil {
		e.timer.Reset(coalesceDelay)
	}
	e.stream = c.stream
	e.pending = append(e.pending, c.data...)
	if len(e.pending) >= coalesceBytes {
		e.flush()
	}
}

func (e *eventWriter) flush() {
	if e.timer != nil {
		e.timer.Stop()
	}
	if len(e.pending) == 0 {
		return
	}
	data := append(e.carry[e.stream], e.pending...)
	k := incompleteSuffix(data)
	e.carry[e.stream] = bytes.Clone(data[len(data)-k:])
	e.emit(e.stream, data[:len(data)-k])
	e.pending = e.pending[:0]
}

// end flushes everything, including characters the streams never finished.
func (e *eventWriter) end() {
	e.flush()
	for stream, b := range e.carry {
		e.emit(stream, b)
		e.carry[stream] = nil
	}
}

func (e *eventWriter) emit(stream int, data []byte) {
	if len(data) == 0 {
		return
	}
	var ev api.ExecEvent
	text := string(data)
	if !utf8.Valid(data) {
		text, ev.Encoding = base64.StdEncoding.EncodeToString(data), api.EncodingBase64
	}
	if stream == streamStdout {
		ev.Stdout = &text
	} else {
		ev.Stderr = &text
	}
	e.write(ev)
}

func (e *eventWriter) write(ev api.ExecEvent) {
	if e.err != nil {
		return
	}
	if e.err = e.enc.Encode(ev); e.err == nil {
		e.err = e.rc.Flush()
	}
}
