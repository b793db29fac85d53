package guestinit

import (
	"fmt"
	"log/slog"
	"maps"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Service prepares the agent of a full VM (the fullvm backend): the guest
// booted its own kernel and init (systemd), which starts dsec-agent as a
// unit. Nothing of the root is assembled here; the agent reads the config
// drive, names the host, takes the sandbox's environment and returns a
// Freezer of the root file system (a snapshot freezes it while the host
// copies the disk).
func Service(log *slog.Logger) (Config, *Freezer, error) {
	t0 := time.Now()
	disks, err := waitDisks(ConfigSerial, 30*time.Second)
	if err != nil {
		return Config{}, nil, err
	}
	cfg, err := readConfigDrive(disks[ConfigSerial])
	if err != nil {
		return Config{}, nil, err
	}
	if cfg.ID != "" {
		if err := unix.Sethostname([]byte(cfg.ID)); err != nil {
			log.Warn("hostname", "err", err)
		}
	}
	env := map[string]string{"PATH": defaultPath, "HOME": "/root", "TERM": "xterm", "DSEC_SANDBOX_ID": cfg.ID}
	if lang := os.Getenv("LANG"); lang != "" {
		env["LANG"] = lang
	}
	maps.Copy(env, cfg.Env)
	os.Clearenv()
	for k, v := range env {
		os.Setenv(k, v)
	}
	freezer, err := openFreezer("/")
	if err != nil {
		return cfg, nil, fmt.Errorf("freezer: %w", err)
	}
	log.Info("full VM agent ready", "sandbox", cfg.ID, "after", time.Since(t0))
	return cfg, freezer, nil
}
