package agent

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// Identity is the body of POST /identity: what makes a guest restored
// from another's memory (a fork of a microVM) a machine of its own.
type Identity struct {
	// Hostname is the new host name and $DSEC_SANDBOX_ID of commands
	// started from now on.
	Hostname string `json:"hostname"`
	// MachineID is written to /etc/machine-id: 32 lowercase hex digits.
	MachineID string `json:"machine_id"`
	// Seed is mixed into the kernel's random pool, credited, and the
	// pool reseeded, so that the copies' random numbers part at once.
	Seed []byte `json:"seed"`
}

// handleIdentity renames the guest (Config.Identity): the host name, the
// machine id, the random seed. Processes already running keep their
// environment; they see the new host name.
func (s *Server) handleIdentity(w http.ResponseWriter, r *http.Request) {
	var id Identity
	if err := decodeJSON(w, r, &id, 1<<12); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.reidentify(id); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, &id)
}

func (s *Server) reidentify(id Identity) error {
	if id.Hostname == "" || len(id.Hostname) > 64 {
		return errdefs.Invalid("hostname: want 1 to 64 bytes")
	}
	if b, err := hex.DecodeString(id.MachineID); err != nil || len(b) != 16 {
		return errdefs.Invalid("machine_id: want 32 hex digits")
	}
	if len(id.Seed) < 16 || len(id.Seed) > 512 {
		return errdefs.Invalid("seed: want 16 to 512 bytes")
	}
	if err := unix.Sethostname([]byte(id.Hostname)); err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	os.Setenv("DSEC_SANDBOX_ID", id.Hostname)
	path := filepath.Join(s.cfg.Root, "etc", "machine-id")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("machine id: %w", err)
	}
	if err := os.WriteFile(path, []byte(id.MachineID+"\n"), 0o444); err != nil {
		return fmt.Errorf("machine id: %w", err)
	}
	return reseed(id.Seed)
}

// reseed adds seed to the kernel's entropy pool, credited
// (RNDADDENTROPY), and makes the CRNG reseed from it now (RNDRESEEDCRNG).
func reseed(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("reseed: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+len(seed)+3)
	binary.NativeEndian.PutUint32(buf[0:], uint32(len(seed)*8))
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(seed)))
	copy(buf[8:], seed)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return fmt.Errorf("reseed: RNDADDENTROPY: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); e != 0 {
		return fmt.Errorf("reseed: RNDRESEEDCRNG: %w", e)
	}
	return nil
}

// SetIdentity renames a guest (see Identity). Agents that are not a
// microVM's answer not found.
func (c *Client) SetIdentity(ctx context.Context, id Identity) error {
	var out Identity
	return c.call(ctx, http.MethodPost, "/identity", &id, &out)
}
