package initramfs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dsec-project/dsec/internal/guestinit"
)

// InitPath is the agent binary in the archive, run by the kernel as PID
// 1. The modules go where the agent's guestinit reads them
// (guestinit.ModuleDir and the files beside it).
const InitPath = "/init"

// Config is what goes into an initramfs.
type Config struct {
	// Init is the static binary to run as /init: dsec-agent.
	Init   string
	Kernel Kernel
	// Modules are module names to load at boot; their dependencies are
	// added.
	Modules []string
}

// Build writes the initramfs of cfg to w and returns the modules it holds,
// in load order.
func Build(w io.Writer, cfg Config) ([]Module, error) {
	mods, err := cfg.Kernel.ResolveModules(cfg.Modules)
	if err != nil {
		return nil, err
	}
	cw := NewWriter(w)
	for _, d := range []string{"/dev", "/proc", "/sys", "/tmp", "/newroot", "/run"} {
		cw.Dir(d, 0o755)
	}
	// The kernel opens /dev/console for init's stdio before devtmpfs is
	// mounted; without the node init starts with no stdio at all.
	cw.CharDev("/dev/console", 0o600, 5, 1)
	f, err := os.Open(cfg.Init)
	if err != nil {
		return nil, fmt.Errorf("initramfs init: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("initramfs init: %w", err)
	}
	cw.File(InitPath, 0o755, st.Size(), f)
	names := make([]string, 0, len(mods))
	for _, m := range mods {
		b, err := ReadModule(m.Path)
		if err != nil {
			return nil, err
		}
		cw.File(guestinit.ModuleDir+"/"+m.Name+".ko", 0o644, int64(len(b)), bytes.NewReader(b))
		names = append(names, m.Name)
	}
	order := strings.Join(names, "\n") + "\n"
	cw.File(guestinit.ModuleOrder, 0o644, int64(len(order)), strings.NewReader(order))
	cw.File(guestinit.KernelRelease, 0o644, int64(len(cfg.Kernel.Version)), strings.NewReader(cfg.Kernel.Version))
	if err := cw.Close(); err != nil {
		return nil, fmt.Errorf("write initramfs: %w", err)
	}
	return mods, nil
}
