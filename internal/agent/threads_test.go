package agent

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/testutil"
)

func TestStatThreads(t *testing.T) {
	for _, c := range []struct {
		stat string
		want int
	}{
		// A command name with spaces and ')' in it: fields count from the last ')'.
		{"4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 7 0 12345 1000 10 18446744073709551615", 7},
		{"1 (dsec-agent) S 0 1 1 0 -1 4194560 2000 0 3 0 40 10 0 0 20 0 12 0 99 1 1", 12},
		{"garbage", 0},
		{"1 (x) S 1 2", 0},
	} {
		if got := statThreads([]byte(c.stat)); got != c.want {
			t.Errorf("statThreads(%q) = %d, want %d", c.stat, got, c.want)
		}
	}
}

func tasks(t *testing.T) int {
	t.Helper()
	d, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(d)
}

func TestThreadCount(t *testing.T) {
	// The runtime may start a thread between the two reads: poll until
	// they agree.
	testutil.EventuallyTrue(t, 5*time.Second, "threadCount() the size of /proc/self/task", func() bool { return threadCount() == tasks(t) })
}

// TestTrimThreads makes the runtime start threads for blocking system
// calls, as an agent's start-up does, and trims them.
func TestTrimThreads(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			syscall.Nanosleep(&syscall.Timespec{Nsec: 30e6}, nil) // blocks its thread, not just its goroutine
		}()
	}
	wg.Wait()
	made := tasks(t)
	before, after := trimThreads(1)
	if before < made-1 || after >= before || after != tasks(t) {
		t.Fatalf("trim: %d threads made, trimThreads says %d before, %d after; /proc says %d now", made, before, after, tasks(t))
	}
	// The runtime still works and makes threads again when it must.
	wg.Add(2)
	for i := 0; i < 2; i++ {
		go func() {
			defer wg.Done()
			syscall.Nanosleep(&syscall.Timespec{Nsec: 30e6}, nil)
		}()
	}
	wg.Wait()
	t.Logf("threads: %d made, %d after the trim, %d after two more blocking calls", made, after, tasks(t))
}

func TestTrimmerWaitsForIdle(t *testing.T) {
	var trims atomic.Int32
	tr := newTrimmer(20*time.Millisecond, func() { trims.Add(1) })
	defer tr.stop()
	testutil.EventuallyTrue(t, 5*time.Second, "trimmed after the first idle period", func() bool { return trims.Load() == 1 })

	// Nothing while a request is in flight: the timer firing then (as
	// it would have, had the request been longer than the period) is
	// ignored.
	tr.begin()
	tr.fire()
	if n := trims.Load(); n != 1 {
		t.Fatalf("%d trims with a request in flight, want 1", n)
	}
	tr.end()
	testutil.EventuallyTrue(t, 5*time.Second, "trimmed after the request ended", func() bool { return trims.Load() == 2 })

	tr.stop()
	tr.begin()
	tr.end()
	tr.fire()
	if n := trims.Load(); n != 2 {
		t.Fatalf("%d trims after stop, want 2", n)
	}
}
