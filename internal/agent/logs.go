package agent

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"unicode/utf8"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// logCursor is where a log reader is in one stream.
type logCursor struct {
	name string
	o    *output
	next int64
	done bool // the stream has ended and all of it was sent
}

// handleOutputEvents answers GET /procs/{id}/output with Accept:
// application/x-ndjson: OutputEvents of stdout and stderr (or the one
// named by stream) from offset and stderr_offset, in the order they are
// read; with follow, until the process has exited, then its exit. A
// character is never split between two events of a stream still
// running.
func (s *Server) handleOutputEvents(w http.ResponseWriter, r *http.Request, p *proc) {
	q := r.URL.Query()
	off, err := queryInt(r, "offset", 0, math.MaxInt64)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	errOff, err := queryInt(r, "stderr_offset", 0, math.MaxInt64)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	follow, err := queryBool(r, "follow")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var cs []*logCursor
	switch q.Get("stream") {
	case "":
		cs = []*logCursor{{name: "stdout", o: p.stdout, next: off}, {name: "stderr", o: p.stderr, next: errOff}}
	case "stdout":
		cs = []*logCursor{{name: "stdout", o: p.stdout, next: off}}
	case "stderr":
		cs = []*logCursor{{name: "stderr", o: p.stderr, next: off}}
	default:
		s.writeError(w, r, errdefs.Invalid("stream %q is not stdout or stderr", q.Get("stream")))
		return
	}
	w.Header().Set("Content-Type", ndjson)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	_ = rc.Flush()
	buf := make([]byte, 32<<10)
	for {
		sent, ended := false, true
		var wakes []<-chan struct{}
		for _, c := range cs {
			if c.done {
				continue
			}
			data, st := c.o.read(c.next, buf)
			if len(data) == 0 && st.closed {
				c.done = true
				continue
			}
			ended = false
			wakes = append(wakes, st.wake)
			if !st.closed {
				data = data[:len(data)-incompleteSuffix(data)]
			}
			if len(data) == 0 {
				c.next = max(c.next, st.start)
				continue
			}
			ev := api.OutputEvent{Stream: c.name, Offset: st.start, Skipped: max(0, st.start-c.next)}
			text := string(data)
			if !utf8.Valid(data) {
				text, ev.Encoding = base64.StdEncoding.EncodeToString(data), api.EncodingBase64
			}
			ev.Data = &text
			if enc.Encode(&ev) != nil {
				return
			}
			c.next = st.start + int64(len(data))
			sent = true
		}
		if sent {
			if rc.Flush() != nil {
				return
			}
			continue
		}
		if ended || !follow {
			break
		}
		// Wait for either stream to move (a write or its end).
		select {
		case <-wakes[0]:
		case <-wakeOr(wakes, 1):
		case <-r.Context().Done():
			return
		}
	}
	if !follow {
		return
	}
	select {
	case <-p.done:
	case <-r.Context().Done():
		return
	}
	v := p.view()
	if enc.Encode(&api.OutputEvent{Exit: v.Result}) == nil {
		_ = rc.Flush()
	}
}

// wakeOr is wakes[i], or a channel that never fires.
func wakeOr(wakes []<-chan struct{}, i int) <-chan struct{} {
	if i < len(wakes) {
		return wakes[i]
	}
	return nil
}
