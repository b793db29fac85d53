package guestinit

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/vmlink"
	"github.com/dsec-project/dsec/internal/vsock"
)

// Listen opens the agent's link to the host that cfg names.
func Listen(cfg Config, log *slog.Logger) (net.Listener, error) {
	switch cfg.Transport {
	case TransportVsock:
		return vsock.Listen(cfg.VsockPort)
	case TransportSerial, "":
		dev, err := findPort(PortName, 10*time.Second)
		if err != nil {
			return nil, err
		}
		// Blocking mode: vmlink reads and writes the port with plain
		// system calls (a port with no host polls as hung up).
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err != nil {
			return nil, fmt.Errorf("open agent port %s: %w", dev, err)
		}
		return vmlink.Listen(fd, log), nil
	}
	return nil, fmt.Errorf("unknown transport %q", cfg.Transport)
}

// findPort waits for the virtio-serial port named name and returns its
// device node.
func findPort(name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		paths, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, p := range paths {
			if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(p))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("virtio-serial port %s did not appear within %s", name, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
