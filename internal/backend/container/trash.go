package container

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// trash removes destroyed sandboxes' directories in the background. What
// a directory holds at the end — the writable layer's image (a sparse file
// of disk_mb whose blocks the host file system frees, and discards, as it
// goes), the runc and agent files — took 4–5 ms to remove on our machines,
// a third of a destroy, before the API answered. A rename into the trash,
// on the same file system, takes microseconds and frees the sandbox's
// name at once; one goroutine removes what is in the trash, in order.
//
// The trash outlives a crash: a new backend finds what was left there
// and removes it. Close waits until it is empty.
type trash struct {
	dir string
	log *slog.Logger
	// prefix makes names unique across the backends that use dir.
	prefix string
	seq    atomic.Uint64

	mu      sync.Mutex
	queue   []string
	running bool
	done    chan struct{} // closed when the running remover stops
}

func newTrash(dir string, log *slog.Logger) (*trash, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	t := &trash{dir: dir, log: log, prefix: fmt.Sprintf("%x", time.Now().UnixNano())}
	left, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range left {
		t.enqueue(filepath.Join(dir, e.Name()))
	}
	return t, nil
}

// put moves path into the trash to be removed in the background. If it
// cannot move it (a mount point, another file system), or there is no
// trash (nil), it removes it here.
func (t *trash) put(path string) error {
	if t == nil {
		return os.RemoveAll(path)
	}
	name := filepath.Join(t.dir, fmt.Sprintf("%s.%s.%d", filepath.Base(path), t.prefix, t.seq.Add(1)))
	if err := os.Rename(path, name); err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return os.RemoveAll(path)
	}
	t.enqueue(name)
	return nil
}

func (t *trash) enqueue(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.queue = append(t.queue, name)
	if !t.running {
		t.running = true
		t.done = make(chan struct{})
		go t.remove(t.done)
	}
}

func (t *trash) remove(done chan struct{}) {
	for {
		t.mu.Lock()
		if len(t.queue) == 0 {
			t.running = false
			close(done)
			t.mu.Unlock()
			return
		}
		name := t.queue[0]
		t.queue = t.queue[1:]
		t.mu.Unlock()
		if err := os.RemoveAll(name); err != nil {
			// Left for the next backend's start to try again.
			t.log.Warn("remove a destroyed sandbox's files", "path", name, "err", err)
		}
	}
}

// wait returns once the trash is empty (or what could not be removed was
// given up on).
func (t *trash) wait() {
	if t == nil {
		return
	}
	t.mu.Lock()
	done, running := t.done, t.running
	t.mu.Unlock()
	if running {
		<-done
	}
}
