package server

import (
	"testing"
	"time"
)

func TestStatsRingRates(t *testing.T) {
	var r statsRing
	t0 := time.Unix(1000, 0)
	r.add(t0, statCounters{creates: 5, execs: 10, errors: 1})
	if n := len(r.snapshot()); n != 0 {
		t.Fatalf("one read gives %d samples, want 0", n)
	}
	r.add(t0.Add(10*time.Second), statCounters{creates: 25, execs: 110, errors: 1})
	got := r.snapshot()
	if len(got) != 1 || got[0].CreatesPer != 2 || got[0].ExecsPer != 10 || got[0].ErrorsPer != 0 {
		t.Fatalf("samples %+v, want creates 2/s, execs 10/s, errors 0/s", got)
	}
	// The ring keeps the last hour only, oldest first.
	c := statCounters{creates: 25, execs: 110, errors: 1}
	for i := 2; i <= statsSamples+5; i++ {
		c.errors += float64(i)
		r.add(t0.Add(time.Duration(i)*10*time.Second), c)
	}
	got = r.snapshot()
	if len(got) != statsSamples {
		t.Fatalf("%d samples, want %d", len(got), statsSamples)
	}
	if last := got[len(got)-1]; last.ErrorsPer != float64(statsSamples+5)/10 {
		t.Errorf("newest sample %+v", last)
	}
	if !got[0].Time.Before(got[1].Time) {
		t.Error("samples are not oldest first")
	}
}

func TestStatCountersFromMetrics(t *testing.T) {
	m := newMetrics()
	m.creates.WithLabelValues("container", "ok").Add(3)
	m.requests.WithLabelValues("POST /v1/sandboxes/{id}/exec", "200").Add(7)
	m.requests.WithLabelValues("POST /v1/sandboxes/{id}/exec", "503").Add(2)
	m.requests.WithLabelValues("GET /v1/sandboxes", "500").Add(1)
	if c := m.readStatCounters(); c.creates != 3 || c.execs != 9 || c.errors != 3 {
		t.Errorf("counters %+v, want creates 3, execs 9, errors 3", c)
	}
}
