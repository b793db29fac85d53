package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/admission"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/scheduler"
)

// admissionPoll is how often waiting creates try again between the
// kicks that a heartbeat or a refresh of the nodes gives.
const admissionPoll = 250 * time.Millisecond

// admissionWait is how long a create may wait for admission: its own
// admission_timeout_seconds, the default, or none (-1).
func admissionWait(secs int64) (time.Duration, error) {
	switch {
	case secs == -1:
		return 0, nil
	case secs == 0:
		return api.DefaultAdmissionTimeout * time.Second, nil
	case secs < 0 || secs > api.MaxAdmissionTimeout:
		return 0, errdefs.Invalid("admission_timeout_seconds must be -1 (do not wait), 0 (the default, %d) or up to %d",
			api.DefaultAdmissionTimeout, api.MaxAdmissionTimeout)
	}
	return time.Duration(secs) * time.Second, nil
}

// reserve picks and books a node for req through the admission queue: at
// once when it can, else, when the only obstacle is busy nodes, after
// waiting its turn for up to p.wait. Room the request can never get
// (memory, disk, pids) fails at once, also while waiting.
func (s *Server) reserve(ctx context.Context, tenant string, req scheduler.Request, p plan) (string, error) {
	var node string
	var busy error
	try := func() (bool, error) {
		id, err := s.sched.Reserve(req)
		if errors.Is(err, scheduler.ErrBusy) {
			busy = err
			return false, nil
		}
		node = id
		return err == nil, err
	}
	wctx, cancel := context.WithTimeoutCause(ctx, p.wait, errAdmissionTimeout)
	defer cancel()
	waited, err := s.admission.Wait(wctx, p.gone, tenant, try)
	if waited > 0 {
		s.metrics.admissionWait.WithLabelValues(admissionResult(err)).Observe(waited.Seconds())
	}
	switch {
	case err == nil:
		if waited > 0 {
			s.log.InfoContext(ctx, "create admitted after waiting for busy nodes", "tenant", tenant, "node", node, "waited", waited)
		}
		return node, nil
	case errors.Is(err, errAdmissionTimeout) && p.wait == 0:
		// The create asked not to wait.
		if busy == nil {
			busy = fmt.Errorf("other creates wait for busy nodes and this one asked not to (admission_timeout_seconds -1): %w",
				errdefs.ErrResourceExhausted)
		}
		return "", busy
	case errors.Is(err, errAdmissionTimeout):
		return "", fmt.Errorf("waited %s (the create's admission_timeout_seconds) for a node that is not busy: %v: %w",
			waited.Round(time.Millisecond), busy, context.DeadlineExceeded)
	case errors.Is(err, admission.ErrGone):
		return "", fmt.Errorf("create abandoned while waiting for admission: the client disconnected: %w", errdefs.ErrUnavailable)
	}
	return "", err
}

var errAdmissionTimeout = errors.New("admission timeout")

func admissionResult(err error) string {
	switch {
	case err == nil:
		return "admitted"
	case errors.Is(err, errAdmissionTimeout):
		return "timeout"
	case errors.Is(err, admission.ErrGone):
		return "gone"
	}
	return "failed"
}

// admissionView is the queue as GET /v1/nodes shows it.
func (s *Server) admissionView() *api.Admission {
	st := s.admission.Stats()
	return &api.Admission{
		Waiting: st.Waiting, Tenants: st.Tenants, OldestWaitMs: st.Oldest.Milliseconds(),
		Admitted: st.Admitted, TimedOut: st.TimedOut, Left: st.Left, MaxCPULoad: s.sched.Config().MaxCPULoad,
	}
}

// registerAdmissionMetrics exports the queue's length and oldest wait;
// the wait of each create that queued is in dsec_admission_wait_seconds.
func (s *Server) registerAdmissionMetrics() {
	s.metrics.admissionWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "dsec_admission_wait_seconds", Help: "Time creates waited in the admission queue for busy nodes, by result: admitted, timeout, gone, failed.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
	}, []string{"result"})
	s.metrics.reg.MustRegister(s.metrics.admissionWait,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dsec_admission_waiting", Help: "Creates waiting in the admission queue for busy nodes.",
		}, func() float64 { return float64(s.admission.Stats().Waiting) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dsec_admission_oldest_wait_seconds", Help: "How long the longest waiting create has waited for admission.",
		}, func() float64 { return s.admission.Stats().Oldest.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dsec_nodes_busy", Help: "Nodes up whose sandboxes keep the CPU threshold of their cores busy.",
		}, func() float64 {
			n := 0
			for _, ns := range s.sched.Nodes() {
				if ns.State == scheduler.NodeUp && scheduler.Busy(ns, s.sched.Config()) {
					n++
				}
			}
			return float64(n)
		}))
}
