package guestinit

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/mount"
)

// Where the initramfs dsec builds (package initramfs) puts the kernel
// modules the guest loads at boot. They are defined here, by their
// reader, so that the agent does not link the initramfs builder and its
// codecs: every package the agent links is resident in every sandbox.
const (
	// ModuleDir holds the modules, decompressed, as <name>.ko.
	ModuleDir = "/lib/dsec-modules"
	// ModuleOrder lists the module names to load, one a line, in order.
	ModuleOrder = "/etc/dsec/modules"
	// KernelRelease holds the kernel version the modules are for.
	KernelRelease = "/etc/dsec/kernel-release"
)

// Where things are mounted in the initramfs before the switch.
const (
	newRoot  = "/newroot"
	layerDir = "/layers"
	rwDir    = "/rw"
	// runtimeDir is the lowest lower layer: the mount points the root
	// needs, so that none is ever created in the sandbox's upper dir.
	runtimeDir = "/runtime"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Boot turns the initramfs into the sandbox: it must run as PID 1 of a
// fresh guest. On return the process's root is the sandbox's overlay and
// its environment the sandbox's; the Freezer reaches its writable disk.
func Boot(log *slog.Logger) (Config, *Freezer, error) {
	t0 := time.Now()
	if err := mountEarly(); err != nil {
		return Config{}, nil, err
	}
	if err := loadModules(log); err != nil {
		return Config{}, nil, err
	}
	tMods := time.Since(t0)
	disks, err := waitDisks(ConfigSerial, 10*time.Second)
	if err != nil {
		return Config{}, nil, err
	}
	cfg, err := readConfigDrive(disks[ConfigSerial])
	if err != nil {
		return Config{}, nil, err
	}
	want := []string{ConfigSerial, WritableSerial}
	for i := range cfg.Layers {
		want = append(want, LayerSerial(i))
	}
	for _, i := range cfg.Blobs {
		want = append(want, BlobSerial(i))
	}
	if disks, err = waitDisks(strings.Join(want, " "), 10*time.Second); err != nil {
		return cfg, nil, err
	}
	if err := assembleRoot(cfg, disks); err != nil {
		return cfg, nil, err
	}
	freezer, err := openFreezer(rwDir)
	if err != nil {
		return cfg, nil, err
	}
	if err := switchRoot(); err != nil {
		return cfg, nil, err
	}
	if err := setupSandbox(cfg); err != nil {
		return cfg, nil, err
	}
	log.Info("guest booted", "sandbox", cfg.ID, "layers", cfg.Layers, "modules", tMods, "init", time.Since(t0))
	return cfg, freezer, nil
}

func mountEarly() error {
	for _, m := range []struct{ src, dst, fstype, data string }{
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, unix.MS_NOSUID, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	return nil
}

// loadModules loads the initramfs's modules in order, each with the
// parameters the kernel command line gives it (modprobe's job, as there
// is no modprobe): QEMU's microvm lists its virtio-mmio devices as
// virtio_mmio.device= parameters.
func loadModules(log *slog.Logger) error {
	order, err := os.ReadFile(ModuleOrder)
	if err != nil {
		return fmt.Errorf("module list: %w", err)
	}
	cmdline, _ := os.ReadFile("/proc/cmdline")
	for _, name := range strings.Fields(string(order)) {
		if err := loadModule(name, moduleParams(string(cmdline), name)); err != nil {
			return err
		}
		os.Remove(filepath.Join(ModuleDir, name+".ko")) // it lives in RAM
	}
	return nil
}

func loadModule(name, params string) error {
	fd, err := unix.Open(filepath.Join(ModuleDir, name+".ko"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("module %s: %w", name, err)
	}
	defer unix.Close(fd)
	if err := unix.FinitModule(fd, params, 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", name, err)
	}
	return nil
}

// moduleParams collects "name.key=value" words of the command line as
// "key=value ..." for module name.
func moduleParams(cmdline, name string) string {
	var out []string
	for _, w := range strings.Fields(cmdline) {
		mod, kv, ok := strings.Cut(w, ".")
		if ok && strings.ReplaceAll(mod, "-", "_") == name && strings.Contains(kv, "=") {
			out = append(out, kv)
		}
	}
	return strings.Join(out, " ")
}

// waitDisks waits until the virtio disks with the serials listed (space
// separated) have appeared, and returns every disk by serial.
func waitDisks(serials string, timeout time.Duration) (map[string]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		disks := map[string]string{}
		paths, _ := filepath.Glob("/sys/block/vd*/serial")
		for _, p := range paths {
			if b, err := os.ReadFile(p); err == nil {
				disks[strings.TrimSpace(string(b))] = "/dev/" + filepath.Base(filepath.Dir(p))
			}
		}
		missing := slices.DeleteFunc(strings.Fields(serials), func(s string) bool { _, ok := disks[s]; return ok })
		if len(missing) == 0 {
			return disks, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("disks %v did not appear within %s (have %v)", missing, timeout, slices.Sorted(maps.Keys(disks)))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// assembleRoot mounts the layers, the writable disk and the overlay of
// them at newRoot.
func assembleRoot(cfg Config, disks map[string]string) error {
	for _, d := range []string{layerDir, rwDir, runtimeDir, newRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("tmpfs", runtimeDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount runtime layer: %w", err)
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "root", "etc", "run"} {
		os.Mkdir(filepath.Join(runtimeDir, d), 0o755)
	}
	os.Chmod(filepath.Join(runtimeDir, "tmp"), 0o1777|os.ModeSticky)
	lowers := []string{runtimeDir}
	for i := range cfg.Layers {
		mp := filepath.Join(layerDir, fmt.Sprint(i))
		os.MkdirAll(mp, 0o755)
		src := mount.Source{Image: disks[LayerSerial(i)], Device: disks[BlobSerial(i)]}
		if err := mount.EROFSFrom(src, mp); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		lowers = append([]string{mp}, lowers...)
	}
	if err := unix.Mount(disks[WritableSerial], rwDir, "ext4", unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mount writable disk: %w", err)
	}
	upper, work := filepath.Join(rwDir, "upper"), filepath.Join(rwDir, "work")
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return mount.Overlay(lowers, upper, work, newRoot)
}

// switchRoot moves the early mounts into the new root and makes it the
// process's root, as switch_root(8) does. What is left of the initramfs
// is removed first: it would otherwise hold RAM for good.
func switchRoot() error {
	for _, p := range []string{ModuleOrder, KernelRelease} {
		os.Remove(p)
	}
	for _, d := range []string{"/proc", "/sys", "/dev"} {
		if err := unix.Mount(d, newRoot+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", d, err)
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	return unix.Chdir("/")
}

// setupSandbox does inside the new root what runc does for a container:
// the pseudo-filesystems, the hostname, the loopback interface, the
// environment.
func setupSandbox(cfg Config) error {
	for _, m := range []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{"shm", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV, "mode=1777"},
		{"mqueue", "/dev/mqueue", "mqueue", unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV, ""},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	os.Symlink("/proc/self/fd", "/dev/fd")
	if err := unix.Sethostname([]byte(cfg.ID)); err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	os.Clearenv()
	env := map[string]string{"PATH": defaultPath, "HOME": "/root", "TERM": "xterm", "DSEC_SANDBOX_ID": cfg.ID}
	maps.Copy(env, cfg.Env)
	for k, v := range env {
		os.Setenv(k, v)
	}
	return nil
}

// loopbackUp sets lo up; a new network namespace (and a fresh guest) has
// it down.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}
