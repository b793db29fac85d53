package scheduler

import "fmt"

// ReserveMany places n sandboxes of one request at once, under one lock (see
// PlaceBatch: the batch spreads over the nodes). It returns the node of
// each sandbox placed, in order; when fewer than n fit, err says why the
// rest did not (the placed ones stay reserved).
func (s *Scheduler) ReserveMany(req Request, n int) ([]string, error) {
	out, err := s.ReserveBatch(req, n)
	if err == nil && len(out) < n {
		err = noRoom(req)
	}
	if err != nil {
		return out, fmt.Errorf("placed %d of %d: %w", len(out), n, err)
	}
	return out, nil
}
