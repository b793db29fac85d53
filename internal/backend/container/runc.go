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

	"github.com/dsec-project/dsec/internal/errdefs"
)

// runc drives the runc binary with its own state root, so that dsec's
// containers never mix with anyone else's.
type runc struct {
	bin  string
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
	cmd := exec.CommandContext(ctx, r.bin, append([]string{"--root", r.root}, args...)...)
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
