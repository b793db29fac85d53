package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/scheduler"
)

// registerBlankPoolMetrics exports the nodes' pools of blank container
// sandboxes (as their last heartbeats reported them), summed over the
// nodes that are up.
func (s *Server) registerBlankPoolMetrics() {
	sum := func(f func(p *api.BlankPool) float64) func() float64 {
		return func() float64 {
			total := 0.0
			for _, n := range s.sched.Nodes() {
				if n.State == scheduler.NodeUp && n.Load.BlankPool != nil {
					total += f(n.Load.BlankPool)
				}
			}
			return total
		}
	}
	s.metrics.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dsec_blank_pool_size", Help: "Blank container sandboxes ready for creates to claim, over the nodes up.",
		}, sum(func(p *api.BlankPool) float64 { return float64(p.Size) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dsec_blank_pool_target", Help: "Blank container sandboxes the nodes' pools refill toward (recent demand, between their minimum and maximum).",
		}, sum(func(p *api.BlankPool) float64 { return float64(p.Target) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "dsec_blank_pool_claims_total", Help: "Creates served from a node's pool of blank sandboxes, over the nodes up (since each node started).",
		}, sum(func(p *api.BlankPool) float64 { return float64(p.Claims) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "dsec_blank_pool_misses_total", Help: "Creates that could have used a node's pool of blank sandboxes but found it empty, over the nodes up.",
		}, sum(func(p *api.BlankPool) float64 { return float64(p.Misses) })),
	)
}
