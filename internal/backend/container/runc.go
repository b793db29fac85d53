package container

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// runc drives the runc binary with its own state root, so that dsec's
// containers never mix with anyone else's.
type runc struct {
	bin string // the name runc is given (and found by): its argv[0]
	// exe is what is executed: a sealed copy of the binary (sealedCopy)
	// or, without one, bin.
	exe  string
	root string
	log  *slog.Logger
	// spares are memory cgroups kept for the next containers; nil: none.
	spares *spares
}

// runState is the part of `runc state` we read.
type runState struct {
	Status string `json:"status"` // created, running, paused, stopped
	Pid    int    `json:"init_process_pid"`
}

func (r runc) command(ctx context.Context, args ...string) *exec.Cmd {
	exe := r.exe
	if exe == "" {
		exe = r.bin
	}
	cmd := exec.CommandContext(ctx, exe, append([]string{"--root", r.root}, args...)...)
	cmd.Args[0] = r.bin
	// runc and the container it starts must not be in the edge's session:
	// a ^C to the server must not reach sandboxes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// run starts a detached container whose init inherits listener as fd 3 and
// writes its stdio to log, from a copy of ns with root attached at
// <bundle>/rootfs. Its memory cgroup is a spare if there is one.
func (r runc) run(ctx context.Context, ns *startNS, root int, id, bundle string, listener, log *os.File, background bool) error {
	runcLog := bundle + "/runc.log"
	r.spares.take(id)
	cmd := r.command(ctx, "--log", runcLog, "--log-format", "json",
		"run", "--detach", "--preserve-fds", "1", "--bundle", bundle, id)
	cmd.ExtraFiles = []*os.File{listener}
	cmd.Stdout, cmd.Stderr = log, log
	if err := ns.run(cmd, root, filepath.Join(bundle, "rootfs"), background); err != nil {
		return fmt.Errorf("runc run %s: %w: %s", id, err, lastRuncError(runcLog))
	}
	return nil
}

// lastRuncError digs the last error message out of runc's JSON log.
func lastRuncError(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no runc log)"
	}
	msg := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var e struct{ Level, Msg string }
		if json.Unmarshal(sc.Bytes(), &e) == nil && (e.Level == "error" || e.Level == "fatal") {
			msg = e.Msg
		}
	}
	if msg == "" {
		return strings.TrimSpace(string(b[max(0, len(b)-512):]))
	}
	return msg
}

func (r runc) simple(ctx context.Context, args ...string) error {
	out, err := r.command(ctx, args...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if strings.Contains(msg, "does not exist") || strings.Contains(msg, "not found") {
			return fmt.Errorf("runc %s: %s: %w", args[0], msg, errdefs.ErrNotFound)
		}
		return fmt.Errorf("runc %s: %w: %s", args[0], err, msg)
	}
	return nil
}

// delete kills every process of the container and removes it and its
// cgroup. A missing container is not an error.
//
// It does itself what `runc delete --force` does — kill the init, wait,
// remove the cgroups and runc's state directory — which saves a runc
// process and runc's fixed 100 ms sleep; runc takes over if that fails.
func (r runc) delete(ctx context.Context, id string) error {
	st, err := r.readState(id)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		t0 := time.Now()
		if err = r.stop(ctx, id, st); err == nil {
			t1 := time.Now()
			if err = r.removeCgroups(st.CgroupPaths); err == nil {
				t2 := time.Now()
				if err = os.RemoveAll(filepath.Join(r.root, id)); err == nil {
					r.log.DebugContext(ctx, "runc: delete steps", "sandbox", id, "kill_and_exit", t1.Sub(t0), "cgroups", t2.Sub(t1), "state", time.Since(t2))
					return nil
				}
			}
		}
	}
	r.log.DebugContext(ctx, "fast delete failed; runc delete --force takes over", "sandbox", id, "err", err)
	err = r.simple(ctx, "delete", "--force", id)
	if err != nil && strings.Contains(err.Error(), "not found") {
		return nil
	}
	return err
}

func (r runc) pause(ctx context.Context, id string) error  { return r.simple(ctx, "pause", id) }
func (r runc) resume(ctx context.Context, id string) error { return r.simple(ctx, "resume", id) }

// state returns the container's state, or ErrNotFound.
func (r runc) state(ctx context.Context, id string) (runState, error) {
	var st runState
	cmd := r.command(ctx, "state", id)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "does not exist") || strings.Contains(msg, "not found") {
			return st, errdefs.NotFound("container %s", id)
		}
		return st, fmt.Errorf("runc state %s: %w: %s", id, err, msg)
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("runc state %s: %w", id, err)
	}
	return st, nil
}

// list returns the ids of every container under our root.
func (r runc) list(ctx context.Context) ([]string, error) {
	out, err := r.command(ctx, "list", "--format", "json").Output()
	if err != nil {
		return nil, fmt.Errorf("runc list: %w", err)
	}
	var cs []struct{ ID string }
	if s := strings.TrimSpace(string(out)); s != "" && s != "null" {
		if err := json.Unmarshal(out, &cs); err != nil {
			return nil, fmt.Errorf("runc list: %w", err)
		}
	}
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	return ids, nil
}

// runcSeals are the seals of the in-memory copy runc makes of itself; a
// copy sealed with exactly these is one runc does not copy again.
const runcSeals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE

// sealedCopy copies the binary at path into a sealed memfd and returns it
// with the path that executes it, good while the file stays open.
//
// runc guards against CVE-2019-5736 (a container overwriting the host's
// runc through /proc/self/exe) by copying its own binary (~9 MB) into a
// sealed memfd and executing that again, at every container start, unless
// it already runs from a sealed memfd: runc 1.1 in C (is_self_cloned),
// 1.2 and later in Go (IsSelfExeCloned). Nothing can write to a sealed
// memfd, so one copy made here serves every start with the same guarantee
// and saves each of them the copy and an exec of runc. The copy costs its
// size in memory once per backend.
func sealedCopy(path string) (*os.File, string, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer src.Close()
	fd, err := unix.MemfdCreate("runc", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, "", fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "runc")
	if _, err := f.ReadFrom(src); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("copy %s: %w", path, err)
	}
	if err := f.Chmod(0o500); err != nil {
		f.Close()
		return nil, "", err
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, runcSeals); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("seal: %w", err)
	}
	exe := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
	// A host that forbids executing memfds (vm.memfd_noexec) refuses here.
	if out, err := exec.Command(exe, "--version").CombinedOutput(); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("run the copy: %w: %s", err, bytes.TrimSpace(out))
	}
	return f, exe, nil
}
