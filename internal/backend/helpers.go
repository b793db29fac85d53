package backend

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// FinishTeardown ends a backend's teardown of sandbox id: when nothing
// before failed it removes the sandbox's directory (a failure keeps it,
// with what a retry needs), and it wraps what failed.
func FinishTeardown(id, dir string, errs []error) error {
	if len(errs) == 0 {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	return nil
}

// Destroy takes sandbox id's record out of records (under mu) and tears
// it down; if that fails the record goes back, so that a retry releases
// what it still holds. teardown gets the zero R for an unknown sandbox.
func Destroy[R comparable](mu *sync.Mutex, records map[string]R, id string, teardown func(R) error) error {
	mu.Lock()
	rec := records[id]
	delete(records, id)
	mu.Unlock()
	if err := teardown(rec); err != nil {
		var zero R
		if rec != zero {
			mu.Lock()
			records[id] = rec
			mu.Unlock()
		}
		return err
	}
	return nil
}

// ShortPath returns a name for path that fits in a sockaddr_un (108
// bytes): the path itself if short, else the name through an O_PATH file
// descriptor of its directory, valid until done is called.
func ShortPath(path string) (short string, done func(), err error) {
	if len(path) < 100 {
		return path, func() {}, nil
	}
	fd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", fd, filepath.Base(path)), func() { unix.Close(fd) }, nil
}

// WriteJSONFile writes v as JSON to path, replacing it whole (through a
// temporary file and a rename): a backend's records of its sandboxes.
func WriteJSONFile(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
