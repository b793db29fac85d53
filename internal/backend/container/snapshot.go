package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// snapshotFreezeMarker, in a sandbox's directory, marks a freeze made by
// Snapshot, not by Pause.
const snapshotFreezeMarker = "snapshot-freeze"

// Snapshot implements backend.Backend: runc pause freezes the sandbox's
// cgroup, so its upper dir stops changing while pack reads it; the upper
// dir is self-contained because overlays are mounted with
// redirect_dir=off,metacopy=off. dsec writes nothing there itself (the
// agent and mount points live in the runtime layer), so nothing is
// excluded.
func (b *Backend) Snapshot(ctx context.Context, id string, merge int, pack func(ctx context.Context, dirs []string) error) (err error) {
	rec, err := b.get(id)
	if err != nil {
		return err
	}
	if merge < 0 || merge > len(rec.Spec.Layers) {
		return errdefs.Invalid("snapshot of %s: cannot merge %d of its %d layers", id, merge, len(rec.Spec.Layers))
	}
	st, err := b.runc.state(ctx, id)
	if err != nil {
		return fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	if st.Status == "stopped" {
		return notRunning(id)
	}
	if st.Status != "paused" {
		// The marker says the freeze is the snapshot's: an edge that dies
		// before the thaw leaves it, and recovery thaws the sandbox.
		marker := filepath.Join(b.dir(id), snapshotFreezeMarker)
		if err := os.WriteFile(marker, nil, 0o600); err != nil {
			return fmt.Errorf("snapshot sandbox %s: %w", id, err)
		}
		if err := b.runc.pause(ctx, id); err != nil {
			os.Remove(marker)
			// An init that is dying (its agent killed) can still read as
			// running for a moment, and its cgroup then refuses to freeze:
			// look again for a little while before calling it either way.
			for range 10 {
				if st, serr := b.runc.state(ctx, id); serr == nil && st.Status == "stopped" {
					return notRunning(id) // it died under us
				}
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
					continue
				}
				break
			}
			return fmt.Errorf("snapshot sandbox %s: freeze (retry): %v: %w", id, err, errdefs.ErrUnavailable)
		}
		defer func() {
			if rerr := b.runc.resume(context.WithoutCancel(ctx), id); rerr != nil && err == nil {
				err = fmt.Errorf("snapshot sandbox %s: thaw: %w", id, rerr)
				return
			}
			os.Remove(marker)
		}()
	}
	// The upper dir lives on the sandbox's own disk image, with ids as the
	// sandbox sees them (the overlay maps them through an idmapped mount),
	// so the layer gets the sandbox's owners. rec.Lowers runs top (last
	// layer) first, the runtime layer last.
	dirs := append([]string{filepath.Join(b.dir(id), "disk", "upper")}, rec.Lowers[:merge]...)
	if err := pack(ctx, dirs); err != nil {
		return fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	return nil
}

// notRunning is the answer to a snapshot of a sandbox whose container has
// stopped (its agent, the container's init, died): a clear refusal, not
// an internal error. The node restarts such a sandbox when the edge
// starts again.
func notRunning(id string) error {
	return fmt.Errorf("snapshot sandbox %s: its container is not running (its agent died): %w", id, errdefs.ErrFailedPrecondition)
}
