package agent

import (
	"bytes"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// An agent is mostly idle: thousands of them wait on a node for their
// next command. The Go runtime never ends an OS thread it made for a
// blocking system call (start-up's mounts, a fork, a file request), and
// each costs a kernel stack, a task and its runtime stacks: an idle agent
// of a 260-sandbox node had 7 threads (6 to 9), of which 2 or 3 were
// idle. The trimmer ends those once the agent has been idle for
// trimIdle, leaving 5 or 6 — the main thread, the runtime's monitor and
// template threads, the commands' spawner, the one waiting on the
// network — and a later request makes the one or two it needs again.

// trimIdle is how long the agent waits after its last request before it
// ends its idle threads: long enough that a turn's requests (an exec, its
// output, a file) reuse the threads the first one made.
const trimIdle = 3 * time.Second

// trimmer ends the runtime's idle threads when no request has been in
// flight for trimIdle.
type trimmer struct {
	idle time.Duration
	trim func()

	mu       sync.Mutex
	inflight int
	stopped  bool
	timer    *time.Timer
}

// newTrimmer calls trim once nothing has been in flight for idle, and
// again after each later request.
func newTrimmer(idle time.Duration, trim func()) *trimmer {
	t := &trimmer{idle: idle, trim: trim}
	t.timer = time.AfterFunc(idle, t.fire)
	return t
}

// begin marks a request in flight; end marks it done and, if it was the
// last, starts the idle period again.
func (t *trimmer) begin() {
	t.mu.Lock()
	t.inflight++
	t.timer.Stop()
	t.mu.Unlock()
}

func (t *trimmer) end() {
	t.mu.Lock()
	t.inflight--
	if t.inflight == 0 && !t.stopped {
		t.timer.Reset(t.idle)
	}
	t.mu.Unlock()
}

// stop ends the trimmer.
func (t *trimmer) stop() {
	t.mu.Lock()
	t.stopped = true
	t.timer.Stop()
	t.mu.Unlock()
}

func (t *trimmer) fire() {
	t.mu.Lock()
	idle := t.inflight == 0 && !t.stopped
	t.mu.Unlock()
	if idle {
		t.trim()
	}
}

// trimThreads ends idle runtime threads until the process has at most
// keep. A goroutine that locks its thread and exits without unlocking
// ends that thread (runtime.LockOSThread): it runs on the thread its
// starter leaves idle when it waits, and the starter is woken on another
// idle one. The main thread is left alone: locked, it would park for good
// instead of ending (the agent keeps its main goroutine there). With no
// idle thread the runtime makes one for the goroutine and nothing is
// saved, so it stops after two attempts in a row that end none. It
// returns the process's thread count before and after.
func trimThreads(keep int) (before, after int) {
	before = threadCount()
	n, misses := before, 0
	for n > keep && misses < 2 {
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			if unix.Gettid() == unix.Getpid() {
				runtime.UnlockOSThread()
			}
			close(done)
		}()
		<-done
		// The thread ends just after the goroutine returns.
		c := n
		for i := 0; i < 20 && c >= n; i++ {
			time.Sleep(50 * time.Microsecond)
			c = threadCount()
		}
		if c <= 0 {
			break
		}
		if c < n {
			misses = 0
		} else {
			misses++
		}
		n = c
	}
	return before, n
}

// threadCount is the process's thread count (0 if /proc cannot say). It
// allocates nothing: an idle agent never collects garbage (its heap stays
// far below the collector's first goal), so every byte allocated while
// it waits stays resident.
func threadCount() int {
	fd, err := unix.Open("/proc/self/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	var buf [512]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil || n <= 0 {
		return 0
	}
	return statThreads(buf[:n])
}

// statThreads reads num_threads, the 20th field of /proc/<pid>/stat: the
// 18th after the command name, which ends at the line's last ")".
func statThreads(stat []byte) int {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := stat[i+1:]
	for field := 3; field < 20; field++ {
		f = bytes.TrimLeft(f, " ")
		j := bytes.IndexByte(f, ' ')
		if j < 0 {
			return 0
		}
		f = f[j:]
	}
	f = bytes.TrimLeft(f, " ")
	n := 0
	for _, c := range f {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}
