package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/testutil"
)

// load is a fake load source: a node with room for free more creates,
// as the scheduler would see it. It records who got through, in order.
type load struct {
	mu    sync.Mutex
	free  int
	order []string
}

func (l *load) open(n int) {
	l.mu.Lock()
	l.free += n
	l.mu.Unlock()
}

func (l *load) try(name string) Try {
	return func() (bool, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.free == 0 {
			return false, nil
		}
		l.free--
		l.order = append(l.order, name)
		return true, nil
	}
}

func (l *load) admitted() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.order)
}

// waitFor polls until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyTrue(t, 10*time.Second, what, cond)
}

// enqueue starts waiters named tenant+number, one at a time so their
// arrival order is known, and returns a channel of their results.
func enqueue(t *testing.T, q *Queue, l *load, names ...string) <-chan error {
	t.Helper()
	errs := make(chan error, len(names))
	for _, name := range names {
		before := q.Stats().Waiting
		go func() {
			_, err := q.Wait(context.Background(), nil, name[:1], l.try(name))
			errs <- err
		}()
		waitFor(t, name+" to queue", func() bool { return q.Stats().Waiting == before+1 })
	}
	return errs
}

func TestFastPathWhenNobodyWaits(t *testing.T) {
	q := New(time.Hour)
	l := &load{free: 1}
	waited, err := q.Wait(context.Background(), nil, "a", l.try("a1"))
	if err != nil || waited != 0 {
		t.Fatalf("Wait = %v, %v; want admitted at once", waited, err)
	}
	if st := q.Stats(); st.Waiting != 0 || st.Admitted != 0 {
		t.Fatalf("stats %+v: nothing should have queued", st)
	}
}

func TestOrderAndFairness(t *testing.T) {
	for _, tc := range []struct {
		name    string
		arrive  []string // tenant is the first letter
		opening []int    // room that opens, step by step
		want    []string
	}{
		{"one tenant is first come first served", []string{"a1", "a2", "a3"}, []int{3}, []string{"a1", "a2", "a3"}},
		{"tenants take turns", []string{"a1", "a2", "a3", "a4", "b1", "b2", "c1"}, []int{7},
			[]string{"a1", "b1", "c1", "a2", "b2", "a3", "a4"}},
		{"a flood does not starve a latecomer", []string{"a1", "a2", "a3", "a4", "a5", "b1"}, []int{1, 1, 1},
			[]string{"a1", "b1", "a2"}},
		{"turns carry over between openings", []string{"a1", "a2", "b1", "b2"}, []int{1, 2, 1},
			[]string{"a1", "b1", "a2", "b2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := New(time.Hour) // only kicks move it
			l := &load{}
			errs := enqueue(t, q, l, tc.arrive...)
			total := 0
			for _, n := range tc.opening {
				l.open(n)
				total += n
				q.Kick()
				waitFor(t, fmt.Sprintf("%d admitted", total), func() bool { return len(l.admitted()) == total })
			}
			if got := l.admitted(); !slices.Equal(got, tc.want) {
				t.Fatalf("admitted %v, want %v", got, tc.want)
			}
			for range total {
				if err := <-errs; err != nil {
					t.Fatalf("an admitted waiter got %v", err)
				}
			}
			st := q.Stats()
			if st.Waiting != len(tc.arrive)-total || st.Admitted != int64(total) {
				t.Fatalf("stats %+v: want %d waiting, %d admitted", st, len(tc.arrive)-total, total)
			}
			// Let the rest through: the test leaves no goroutine behind.
			l.open(len(tc.arrive) - total)
			q.Kick()
			for range len(tc.arrive) - total {
				<-errs
			}
		})
	}
}

func TestNewcomerDoesNotJumpTheQueue(t *testing.T) {
	q := New(time.Hour)
	l := &load{}
	errs := enqueue(t, q, l, "a1")
	// Room opens, but before the queue gets to try, a newcomer arrives:
	// it must not take the room from the one already waiting.
	l.open(1)
	late := enqueue(t, q, l, "b1")
	if got := l.admitted(); len(got) != 0 {
		t.Fatalf("admitted %v before the queue's turn", got)
	}
	q.Kick()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if got := l.admitted(); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("admitted %v, want [a1]", got)
	}
	l.open(1)
	q.Kick()
	if err := <-late; err != nil {
		t.Fatal(err)
	}
}

func TestTimeoutAndGone(t *testing.T) {
	q := New(10 * time.Millisecond)
	l := &load{}
	tooLong := errors.New("waited too long")
	ctx, cancel := context.WithTimeoutCause(context.Background(), 100*time.Millisecond, tooLong)
	defer cancel()
	waited, err := q.Wait(ctx, nil, "a", l.try("a1"))
	if !errors.Is(err, tooLong) {
		t.Fatalf("Wait = %v; want the context's cause", err)
	}
	if waited <= 0 {
		t.Fatalf("waited %v; want the time spent in the queue", waited)
	}

	gone := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		_, err := q.Wait(context.Background(), gone, "b", l.try("b1"))
		res <- err
	}()
	waitFor(t, "b1 to queue", func() bool { return q.Stats().Waiting == 1 })
	close(gone)
	if err := <-res; !errors.Is(err, ErrGone) {
		t.Fatalf("Wait = %v; want ErrGone", err)
	}
	st := q.Stats()
	if st.Waiting != 0 || st.Tenants != 0 || st.TimedOut != 1 || st.Left != 1 || len(l.admitted()) != 0 {
		t.Fatalf("stats %+v, admitted %v: want an empty queue, one timed out, one left", st, l.admitted())
	}
	waitFor(t, "the dispatcher to stop", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return !q.running
	})

	// An already expired deadline fails at once when the create would
	// have to wait.
	ctx, cancel = context.WithTimeoutCause(context.Background(), 0, tooLong)
	defer cancel()
	if _, err := q.Wait(ctx, nil, "a", l.try("a2")); !errors.Is(err, tooLong) {
		t.Fatalf("Wait with no time to wait = %v; want the cause at once", err)
	}
}

func TestHardFailureWhileWaiting(t *testing.T) {
	q := New(time.Hour)
	var mu sync.Mutex
	hard := false
	boom := errors.New("out of memory now")
	try := func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if hard {
			return false, boom
		}
		return false, nil
	}
	res := make(chan error, 1)
	go func() {
		_, err := q.Wait(context.Background(), nil, "a", try)
		res <- err
	}()
	waitFor(t, "the waiter to queue", func() bool { return q.Stats().Waiting == 1 })
	mu.Lock()
	hard = true
	mu.Unlock()
	q.Kick()
	if err := <-res; !errors.Is(err, boom) {
		t.Fatalf("Wait = %v; want the hard failure", err)
	}
}

func TestStatsShowTheWait(t *testing.T) {
	q := New(time.Hour)
	l := &load{}
	errs := enqueue(t, q, l, "a1", "b1", "b2")
	waitFor(t, "some wait", func() bool { return q.Stats().Oldest > 20*time.Millisecond })
	st := q.Stats()
	if st.Waiting != 3 || st.Tenants != 2 {
		t.Fatalf("stats %+v: want 3 waiting from 2 tenants", st)
	}
	l.open(3)
	q.Kick()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if st := q.Stats(); st.Waiting != 0 || st.Admitted != 3 || st.Oldest != 0 {
		t.Fatalf("stats %+v after all were admitted", st)
	}
}
