package microvm

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/screen"
)

// ScreenVMM is implemented by VMM drivers whose full VMs have a screen.
type ScreenVMM interface {
	// Screendump writes the screen to path as a binary PPM.
	Screendump(ctx context.Context, m *Machine, p Process, path string) error
	// SendInput performs steps on a screen of size d.
	SendInput(ctx context.Context, m *Machine, p Process, steps []screen.Step, d api.Display) error
}

var _ backend.Display = (*Backend)(nil)

// screenVM is the full VM id names and the VMM's screen driver.
func (b *Backend) screenVM(id string) (*vm, ScreenVMM, error) {
	v, err := b.get(id)
	if err != nil {
		return nil, nil, err
	}
	sv, ok := b.cfg.VMM.(ScreenVMM)
	if v.Machine.Type != TypeQ35 || !ok {
		return nil, nil, errdefs.Invalid("sandbox %s has no screen: only fullvm sandboxes (and containers running an X server) do", id)
	}
	return v, sv, nil
}

// Screenshot implements backend.Display: QEMU dumps the screen as PPM
// into the sandbox's directory, and it is encoded as PNG.
func (b *Backend) Screenshot(ctx context.Context, id string) ([]byte, api.Display, error) {
	v, sv, err := b.screenVM(id)
	if err != nil {
		return nil, api.Display{}, err
	}
	f, err := os.CreateTemp(v.Machine.Dir, "screen-*.ppm")
	if err != nil {
		return nil, api.Display{}, fmt.Errorf("screen of %s: %w", id, err)
	}
	path := f.Name()
	f.Close()
	defer os.Remove(path)
	if err := sv.Screendump(ctx, &v.Machine, v.proc(), path); err != nil {
		return nil, api.Display{}, fmt.Errorf("screen of %s: %w", id, err)
	}
	f, err = os.Open(path)
	if err != nil {
		return nil, api.Display{}, fmt.Errorf("screen of %s: %w", id, err)
	}
	defer f.Close()
	return screen.PPMToPNG(f)
}

// Input implements backend.Display. The screen's size comes from a fresh
// screendump: a guest may change its resolution at any time.
func (b *Backend) Input(ctx context.Context, id string, actions []api.InputAction) (api.Display, error) {
	v, sv, err := b.screenVM(id)
	if err != nil {
		return api.Display{}, err
	}
	if v.link.paused.Load() {
		return api.Display{}, fmt.Errorf("sandbox %s is paused: %w", id, errdefs.ErrFailedPrecondition)
	}
	_, d, err := b.Screenshot(ctx, id)
	if err != nil {
		return api.Display{}, err
	}
	steps, err := screen.Compile(actions, d)
	if err != nil {
		return d, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := sv.SendInput(ctx, &v.Machine, v.proc(), steps, d); err != nil {
		return d, fmt.Errorf("input to %s: %w", id, err)
	}
	return d, nil
}

// DialVNC implements backend.Display: QEMU's VNC server of the VM.
func (b *Backend) DialVNC(ctx context.Context, id string) (net.Conn, error) {
	v, _, err := b.screenVM(id)
	if err != nil {
		return nil, err
	}
	c, err := DialUnix(ctx, filepath.Join(v.Machine.Dir, VNCSocket))
	if err != nil {
		return nil, fmt.Errorf("vnc of %s: %w: %w", id, err, errdefs.ErrUnavailable)
	}
	return c, nil
}
