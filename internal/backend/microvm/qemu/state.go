package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/dsec-project/dsec/internal/backend/microvm"
)

// migrateBandwidth lifts QEMU's default migration rate limit (32 MiB/s),
// which is meant for live migration over a network: a stopped guest's
// state goes to a local file as fast as the disk takes it.
const migrateBandwidth = 64 << 30

// stateTimeout bounds saving or loading a guest's state.
const stateTimeout = 5 * time.Minute

// SaveState implements microvm.VMM: with the vCPUs stopped, the guest's
// RAM and device state are written to path by QEMU's migration, to a file
// descriptor handed over QMP (QEMU 7.2, Debian 12's, has no file:
// migration, and an exec: one may kill its writer before it has written
// everything). The machine stays stopped; Resume continues it (its disks
// are handed back to it by "cont"), Stop ends it.
func (v *VMM) SaveState(ctx context.Context, m *microvm.Machine, p microvm.Process, path string) error {
	if !p.Alive() {
		return fmt.Errorf("qemu save state of %s: %w", m.ID, errGone)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("qemu save state of %s: %w", m.ID, err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(ctx, stateTimeout)
	defer cancel()
	err = qmpSessionFD(ctx, filepath.Join(m.Dir, microvm.ControlSock), f, func(run func(string, any, any) error) error {
		if err := run("stop", nil, nil); err != nil {
			return err
		}
		if err := run("migrate-set-parameters", map[string]any{"max-bandwidth": migrateBandwidth}, nil); err != nil {
			return err
		}
		if err := run("getfd", map[string]any{"fdname": "state"}, nil); err != nil {
			return err
		}
		if err := run("migrate", map[string]any{"uri": "fd:state"}, nil); err != nil {
			return err
		}
		for {
			var st struct {
				Status    string `json:"status"`
				ErrorDesc string `json:"error-desc"`
			}
			if err := run("query-migrate", nil, &st); err != nil {
				return err
			}
			switch st.Status {
			case "completed":
				return nil
			case "failed", "cancelled":
				return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	if err != nil {
		if ctx.Err() != nil {
			v.control(context.WithoutCancel(ctx), m, p, "migrate_cancel", nil, nil)
		}
		return fmt.Errorf("qemu save state of %s: %w", m.ID, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("qemu save state of %s: %w", m.ID, err)
	}
	return nil
}

// Restore implements microvm.VMM: QEMU starts as Start starts it, but
// waiting for an incoming migration, loads the state at path (through a
// file descriptor handed over QMP) and runs the guest from there. m must
// have the devices of the machine that saved the state (its disks may be
// other files with the same content).
func (v *VMM) Restore(ctx context.Context, m *microvm.Machine, path string) (microvm.Process, error) {
	f, err := os.Open(path)
	if err != nil {
		return microvm.Process{}, fmt.Errorf("qemu restore of %s: %w", m.ID, err)
	}
	defer f.Close()
	p, err := v.start(ctx, m, "-incoming", "defer")
	if err != nil {
		return microvm.Process{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, stateTimeout)
	defer cancel()
	err = qmpSessionFD(ctx, filepath.Join(m.Dir, microvm.ControlSock), f, func(run func(string, any, any) error) error {
		if err := run("getfd", map[string]any{"fdname": "state"}, nil); err != nil {
			return err
		}
		if err := run("migrate-incoming", map[string]any{"uri": "fd:state"}, nil); err != nil {
			return err
		}
		for {
			var st struct {
				Status string `json:"status"`
			}
			if err := run("query-status", nil, &st); err != nil {
				return err
			}
			switch st.Status {
			case "running":
				return nil
			case "inmigrate", "prelaunch", "restore-vm":
			case "paused", "postmigrate":
				// The state was saved from a stopped guest: it loads
				// stopped, and goes on here.
				if err := run("cont", nil, nil); err != nil {
					return err
				}
			default:
				return errors.New("the guest is " + st.Status + " after loading its state")
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	if err != nil {
		p.Kill(context.WithoutCancel(ctx))
		return microvm.Process{}, fmt.Errorf("qemu restore of %s: %w", m.ID, err)
	}
	return p, nil
}
