package agent

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/testutil"
)

// lateWriter takes its first write late, as an agent starved of CPU reads
// its pipes late, and says when that write began.
type lateWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	began chan struct{}
	once  sync.Once
	delay time.Duration
}

func (w *lateWriter) Write(p []byte) (int, error) {
	first := false
	w.once.Do(func() { first = true; close(w.began) })
	if first {
		// sleep: a pump late to read (an agent starved of CPU) is the case under test
		time.Sleep(w.delay)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *lateWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestDrainKeepsTheLeadersOutput: output the leader wrote before it
// exited is read in full however late the pump gets to it, even while a
// lingering child holds the pipe open; a child that writes on and on does
// not hold the drain forever.
func TestDrainKeepsTheLeadersOutput(t *testing.T) {
	pipes, err := openStdio(false)
	if err != nil {
		t.Fatal(err)
	}
	defer pipes.closeChild()
	out := &lateWriter{began: make(chan struct{}), delay: 4 * drainGrace}
	var errOut bytes.Buffer
	c := &command{io: pipes}
	c.pumps.Add(2)
	go c.pump(0, pipes.stdout, out)
	go c.pump(1, pipes.stderr, &errOut)

	unix.Write(pipes.child[1], []byte("first\n"))
	<-out.began // the pump holds "first" and is late to read again
	unix.Write(pipes.child[1], []byte("second\n"))
	// The leader exits here; the write ends stay open, as a background
	// child of the leader would keep them.
	c.drain()
	if got := out.String(); got != "first\nsecond\n" {
		t.Fatalf("drained %q; want all the leader wrote", got)
	}

	t.Run("endless writer", func(t *testing.T) {
		pipes, err := openStdio(false)
		if err != nil {
			t.Fatal(err)
		}
		defer pipes.closeChild()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			chunk := bytes.Repeat([]byte("y\n"), 512)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := unix.Write(pipes.child[1], chunk); err != nil {
					return
				}
			}
		}()
		var sink bytes.Buffer
		c := &command{io: pipes}
		c.pumps.Add(2)
		go c.pump(0, pipes.stdout, &sink)
		go c.pump(1, pipes.stderr, &bytes.Buffer{})
		testutil.EventuallyTrue(t, 10*time.Second, "the pump reading the endless writer", func() bool { return c.read[0].Load() > 0 })
		c.drain() // returns: what was owed at the exit is bounded
		close(stop)
		wg.Wait() // drain closed the read end: a write into the full pipe fails
		pipes.closeChild()
	})
}
