package scheduler

import "fmt"

// ReserveMany places n sandboxes of one request at once, under one lock, so
// that a batch is placed in one pass instead of n round trips. Each
// sandbox goes where Place would put it given the ones placed before it, so
// a batch spreads by free memory like single creates do. It returns the
// node of each sandbox placed, in order; when fewer than n fit, err says
// why the rest did not (the placed ones stay reserved).
func (s *Scheduler) ReserveMany(req Request, n int) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	nodes := make([]*NodeState, 0, len(s.nodes))
	for _, node := range s.nodes {
		nodes = append(nodes, node)
	}
	out := make([]string, 0, n)
	for len(out) < n {
		best, bestScore := (*NodeState)(nil), -1.0
		for _, node := range nodes {
			if !fits(*node, req, s.cfg) {
				continue
			}
			score := 1 - float64(node.Allocated.MemoryMB+req.Resources.MemoryMB)/float64(node.Capacity.MemoryMB)
			if score > bestScore || (score == bestScore && node.ID < best.ID) {
				best, bestScore = node, score
			}
		}
		if best == nil {
			_, err := Place(nil, req, s.cfg)
			return out, fmt.Errorf("placed %d of %d: %w", len(out), n, err)
		}
		s.add(best.ID, req.Resources, 1)
		out = append(out, best.ID)
	}
	return out, nil
}
