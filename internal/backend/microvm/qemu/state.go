package qemu

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dsec-project/dsec/internal/backend/microvm"
)

// migrateBandwidth lifts QEMU's default migration rate limit (32 MiB/s),
// which is meant for live migration over a network: a stopped guest's
// state goes to a local file as fast as the disk takes it.
const migrateBandwidth = 64 << 30

// SaveState implements microvm.VMM: with the vCPUs stopped, the guest's
// RAM and device state are written to path by QEMU's migration (to a
// `cat` it runs: QEMU 7.2, Debian 12's, has no file: migration). The
// machine stays stopped; Resume continues it (its disks are handed back
// to it by "cont"), Stop ends it.
func (v *VMM) SaveState(ctx context.Context, m *microvm.Machine, p microvm.Process, path string) error {
	if strings.ContainsAny(path, "'\n") {
		return fmt.Errorf("qemu save state of %s: unsafe path %q", m.ID, path)
	}
	if err := v.control(ctx, m, p, "stop", nil, nil); err != nil {
		return err
	}
	if err := v.control(ctx, m, p, "migrate-set-parameters", map[string]any{"max-bandwidth": migrateBandwidth}, nil); err != nil {
		return err
	}
	if err := v.control(ctx, m, p, "migrate", map[string]any{"uri": "exec:cat > '" + path + "'"}, nil); err != nil {
		return err
	}
	return v.waitMigration(ctx, m, p, "query-migrate")
}

// waitMigration polls the state of a migration until it completes.
func (v *VMM) waitMigration(ctx context.Context, m *microvm.Machine, p microvm.Process, query string) error {
	for {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := v.control(ctx, m, p, query, nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("qemu migration of %s %s: %s", m.ID, st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			v.control(context.WithoutCancel(ctx), m, p, "migrate_cancel", nil, nil)
			return fmt.Errorf("qemu migration of %s: %w", m.ID, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Restore implements microvm.VMM: QEMU starts as Start starts it, but
// waiting for an incoming migration, loads the state at path and runs
// the guest from there. m must have the devices of the machine that
// saved the state (its disks may be other files with the same content).
func (v *VMM) Restore(ctx context.Context, m *microvm.Machine, path string) (microvm.Process, error) {
	if strings.ContainsAny(path, "'\n") {
		return microvm.Process{}, fmt.Errorf("qemu restore of %s: unsafe path %q", m.ID, path)
	}
	p, err := v.start(ctx, m, "-incoming", "defer")
	if err != nil {
		return microvm.Process{}, err
	}
	fail := func(err error) (microvm.Process, error) {
		p.Kill(context.WithoutCancel(ctx))
		return microvm.Process{}, fmt.Errorf("qemu restore of %s: %w", m.ID, err)
	}
	if err := v.control(ctx, m, p, "migrate-incoming", map[string]any{"uri": "exec:cat '" + path + "'"}, nil); err != nil {
		return fail(err)
	}
	for {
		var st struct {
			Status string `json:"status"`
		}
		if err := v.control(ctx, m, p, "query-status", nil, &st); err != nil {
			return fail(err)
		}
		switch st.Status {
		case "running":
			return p, nil
		case "inmigrate", "prelaunch", "restore-vm", "paused":
		default:
			return fail(errors.New("the guest is " + st.Status + " after loading its state"))
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
