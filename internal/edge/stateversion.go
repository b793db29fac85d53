package edge

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// StateVersion is the version of the layout of a node's data directory
// (sandbox records, layer data, blobfs) this binary reads and writes. An
// edge replaced in place by a newer binary takes over the sandboxes the
// old one left; a newer layout must bump it, and the newer binary migrate
// older directories when it starts.
const StateVersion = 1

// stateFile records the layout version of a node's data directory.
const stateFile = "state-version.json"

type stateRecord struct {
	Version int `json:"version"`
}

// CheckStateVersion reads the layout version of the node data directory
// dir and refuses one newer than this binary knows (an edge downgraded
// under a newer one's sandboxes): it would misread them. A directory
// without a record (new, or written before versions were recorded: the
// same layout as version 1) or with an older one is stamped with
// StateVersion.
func CheckStateVersion(dir string) error {
	p := filepath.Join(dir, stateFile)
	b, err := os.ReadFile(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("node state version: %w", err)
	default:
		var r stateRecord
		if err := json.Unmarshal(b, &r); err != nil || r.Version <= 0 {
			return errdefs.Invalid("node state version in %s is unreadable (%q): refusing to guess", p, b)
		}
		if r.Version > StateVersion {
			return errdefs.Invalid("node data directory %s has state version %d, newer than this binary's %d: "+
				"it was written by a newer dsec; run that version (or newer) on this node", dir, r.Version, StateVersion)
		}
		if r.Version == StateVersion {
			return nil
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, _ = json.Marshal(stateRecord{Version: StateVersion})
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
