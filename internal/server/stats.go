package server

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/dsec-project/dsec/internal/httpapi"
)

// The server's own recent rates, for the dashboard: a small in-memory ring
// of samples of the counters it already keeps for Prometheus, so that no
// Prometheus is needed to see the last hour. Each replica keeps its own.
const (
	statsInterval = 10 * time.Second
	statsSamples  = 360 // an hour
)

// statCounters are the cumulative counters one sample reads.
type statCounters struct {
	creates, execs, errors float64
}

// StatsSample is one point of GET /v1/stats: rates over the interval
// that ends at Time.
type StatsSample struct {
	Time       time.Time `json:"time"`
	CreatesPer float64   `json:"creates_per_s"`
	ExecsPer   float64   `json:"execs_per_s"`
	ErrorsPer  float64   `json:"errors_per_s"`
}

type statsRing struct {
	mu      sync.Mutex
	samples []StatsSample // oldest first, at most statsSamples
	last    statCounters
	lastAt  time.Time
}

// add records the counters read at now, as rates since the previous read.
func (r *statsRing) add(now time.Time, c statCounters) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.lastAt.IsZero() {
		secs := now.Sub(r.lastAt).Seconds()
		if secs > 0 {
			rate := func(a, b float64) float64 { return max(0, b-a) / secs }
			if len(r.samples) == statsSamples {
				r.samples = append(r.samples[:0], r.samples[1:]...)
			}
			r.samples = append(r.samples, StatsSample{Time: now.UTC(),
				CreatesPer: rate(r.last.creates, c.creates),
				ExecsPer:   rate(r.last.execs, c.execs),
				ErrorsPer:  rate(r.last.errors, c.errors)})
		}
	}
	r.last, r.lastAt = c, now
}

func (r *statsRing) snapshot() []StatsSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]StatsSample(nil), r.samples...)
}

// readStatCounters sums the Prometheus counters: sandbox creates (every
// result), exec requests, and API answers with a 5xx status.
func (m *metrics) readStatCounters() statCounters {
	var c statCounters
	fams, err := m.reg.Gather()
	if err != nil {
		return c
	}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			v := mt.GetCounter().GetValue()
			switch f.GetName() {
			case "dsec_sandbox_creates_total":
				c.creates += v
			case "dsec_http_requests_total":
				var route string
				var code int
				for _, l := range mt.GetLabel() {
					switch l.GetName() {
					case "route":
						route = l.GetValue()
					case "code":
						code, _ = strconv.Atoi(l.GetValue())
					}
				}
				if route == "POST /v1/sandboxes/{id}/exec" {
					c.execs += v
				}
				if code >= 500 {
					c.errors += v
				}
			}
		}
	}
	return c
}

func (s *Server) runStats(ctx context.Context) {
	s.stats.add(time.Now(), s.metrics.readStatCounters())
	tick := time.NewTicker(statsInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			s.stats.add(now, s.metrics.readStatCounters())
		}
	}
}

// getStats is GET /v1/stats (admin).
func (s *Server) getStats(w http.ResponseWriter, r *http.Request) error {
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{
		"interval_seconds": int(statsInterval / time.Second),
		"samples":          s.stats.snapshot(),
	})
	return nil
}
