package agent

import (
	"io"
	"sync"
)

// LogWriter passes writes on until max bytes have been written, then
// writes one last line saying so and drops the rest: the agent's log must
// not grow without bound however long the sandbox lives.
type LogWriter struct {
	mu   sync.Mutex
	w    io.Writer
	left int64
}

// NewLogWriter caps w at max bytes.
func NewLogWriter(w io.Writer, max int64) *LogWriter { return &LogWriter{w: w, left: max} }

const logCapped = "dsec-agent: log limit reached; logging stopped\n"

// Write never fails: losing a log line must not fail what was logged.
func (l *LogWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.left < 0:
	case int64(len(p)) <= l.left:
		l.left -= int64(len(p))
		_, _ = l.w.Write(p)
	default:
		l.left = -1
		_, _ = io.WriteString(l.w, logCapped)
	}
	return len(p), nil
}
