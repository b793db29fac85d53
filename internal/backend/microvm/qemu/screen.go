package qemu

import (
	"context"
	"path/filepath"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend/microvm"
	"github.com/dsec-project/dsec/internal/screen"
)

var _ microvm.ScreenVMM = (*VMM)(nil)

// Screendump implements microvm.ScreenVMM: QMP screendump, a PPM file.
func (v *VMM) Screendump(ctx context.Context, m *microvm.Machine, p microvm.Process, path string) error {
	return v.control(ctx, m, p, "screendump", map[string]any{"filename": path}, nil)
}

// absMax is the top of QEMU's absolute pointer axes (INPUT_EVENT_ABS_MAX).
const absMax = 0x7fff

// Key events are paced: the PS/2 keyboard's queue holds 16 bytes, and a
// guest slowed by emulation drops what overflows it.
const keyPace = 15 * time.Millisecond

// SendInput implements microvm.ScreenVMM: each step is a QMP
// input-send-event (absolute pointer for the USB tablet, buttons, qcode
// keys) on one connection, waits are slept.
func (v *VMM) SendInput(ctx context.Context, m *microvm.Machine, p microvm.Process, steps []screen.Step, d api.Display) error {
	if !p.Alive() {
		return errGone
	}
	scale := func(n, size int) int {
		if size <= 1 {
			return 0
		}
		return n * absMax / (size - 1)
	}
	return qmpSession(ctx, filepath.Join(m.Dir, microvm.ControlSock), func(run func(string, any, any) error) error {
		for _, s := range steps {
			var events []map[string]any
			switch s.Kind {
			case screen.StepMove:
				events = []map[string]any{
					{"type": "abs", "data": map[string]any{"axis": "x", "value": scale(s.X, d.Width)}},
					{"type": "abs", "data": map[string]any{"axis": "y", "value": scale(s.Y, d.Height)}},
				}
			case screen.StepButton:
				events = []map[string]any{{"type": "btn", "data": map[string]any{"down": s.Down, "button": s.Button}}}
			case screen.StepKey:
				events = []map[string]any{{"type": "key", "data": map[string]any{
					"down": s.Down, "key": map[string]any{"type": "qcode", "data": s.Key}}}}
			case screen.StepWait:
				if err := sleep(ctx, s.Wait); err != nil {
					return err
				}
				continue
			}
			if err := run("input-send-event", map[string]any{"events": events}, nil); err != nil {
				return err
			}
			if s.Kind == screen.StepKey {
				if err := sleep(ctx, keyPace); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
