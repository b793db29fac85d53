// Package guestinit is what dsec-agent does as the init of a microVM
// before it serves the agent API: mount /proc, /sys and /dev, load the
// kernel modules shipped in the initramfs, read the host's configuration
// from the config drive, mount the sandbox's read-only EROFS layers (each
// a virtio block device) and its writable disk, stack them with overlayfs,
// switch root into the overlay, and open the link to the host: a vsock
// listener, or the virtio-serial port multiplexed by package vmlink.
//
// The host side (the microvm backend) writes the configuration with
// WriteConfigDrive and names every drive by its virtio serial, so nothing
// depends on the order in which the guest probes devices. This package
// must never leave the initramfs reachable from the sandbox's root, and
// never run anything but on behalf of the agent.
package guestinit

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
)

// Drive serials and the port name the host and the guest agree on. A
// virtio-blk serial holds at most 20 bytes.
const (
	ConfigSerial   = "dsec-config"
	WritableSerial = "dsec-rw"
	// LayerSerial(i) names layer i, base first; BlobSerial(i) its data blob.
	layerSerialPrefix = "dsec-layer-"
	blobSerialPrefix  = "dsec-blob-"
	// PortName is the virtio-serial port of the agent link.
	PortName = "dsec.agent"
)

// LayerSerial is the virtio serial of layer i (0 is the base).
func LayerSerial(i int) string { return layerSerialPrefix + strconv.Itoa(i) }

// BlobSerial is the virtio serial of layer i's data blob, for a chunked
// layer (metadata image + data blob, mounted with EROFS's device=).
func BlobSerial(i int) string { return blobSerialPrefix + strconv.Itoa(i) }

// Transports between the host and the agent.
const (
	TransportSerial = "serial" // virtio-serial port + vmlink
	TransportVsock  = "vsock"
)

// Config is what the host tells the guest, as JSON on the config drive.
type Config struct {
	// ID is the sandbox id: the hostname and $DSEC_SANDBOX_ID.
	ID string `json:"id"`
	// Layers is how many layer drives there are.
	Layers int `json:"layers"`
	// Blobs lists the layers (by index) that have a data blob drive.
	Blobs []int `json:"blobs,omitempty"`
	// Env is set for the agent and every command it runs.
	Env map[string]string `json:"env,omitempty"`
	// Transport is TransportSerial or TransportVsock; VsockPort is the
	// port the agent listens on for the latter.
	Transport string `json:"transport"`
	VsockPort uint32 `json:"vsock_port,omitempty"`
	// MaxFileBytes bounds files read or written through the agent.
	MaxFileBytes int64 `json:"max_file_bytes,omitempty"`
}

// configDriveSize is the size of the config drive: JSON, zero-padded.
const configDriveSize = 64 << 10

// WriteConfigDrive writes cfg as a raw drive image at path.
func WriteConfigDrive(path string, cfg Config) error {
	b, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("config drive: %w", err)
	}
	if len(b) >= configDriveSize {
		return fmt.Errorf("config drive: %d bytes of configuration, more than %d", len(b), configDriveSize-1)
	}
	buf := make([]byte, configDriveSize)
	copy(buf, b)
	if err := os.WriteFile(path, buf, 0o600); err != nil {
		return fmt.Errorf("config drive: %w", err)
	}
	return nil
}

// readConfigDrive reads the configuration back from a block device.
func readConfigDrive(dev string) (Config, error) {
	var cfg Config
	f, err := os.Open(dev)
	if err != nil {
		return cfg, fmt.Errorf("config drive: %w", err)
	}
	defer f.Close()
	buf := make([]byte, configDriveSize)
	n, err := f.ReadAt(buf, 0)
	if n == 0 {
		return cfg, fmt.Errorf("config drive %s: %w", dev, err)
	}
	end := 0
	for end < n && buf[end] != 0 {
		end++
	}
	if err := json.Unmarshal(buf[:end], &cfg); err != nil {
		return cfg, fmt.Errorf("config drive %s: %w", dev, err)
	}
	return cfg, nil
}
