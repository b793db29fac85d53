package agent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// handlePlaceCommands takes the "tasks" files of the cgroup v1 cgroups the
// commands are to run in (descriptors, SCM_RIGHTS, opened by the edge: the
// write permission is the opener's): a cpu cgroup that holds their quota,
// a pids cgroup that holds their limit. Every later command starts in
// them, forked from a spawner thread that joined them. The agent's own
// threads stay where they are: the sandbox's CPU quota is on the commands'
// cgroup, so the agent serving an exec is never throttled by it, and the
// commands' pids limit leaves the agent room for the threads it needs
// when they have used it all (a fork bomb).
//
// It answers once a spawner has joined the cgroups: on an error the
// commands stay in the agent's cgroups and the edge puts their limits
// back there.
func (s *Server) handlePlaceCommands(w http.ResponseWriter, r *http.Request) {
	fds := receivedFDs(r)
	if err := checkTasksFiles(fds); err != nil {
		closeFDs(fds)
		s.writeError(w, r, fmt.Errorf("place commands: %w", err))
		return
	}
	if s.noConfine {
		closeFDs(fds)
		s.writeError(w, r, errdefs.Invalid("place commands: this agent forks commands from the calling thread"))
		return
	}
	s.policyMu.Lock()
	defer s.policyMu.Unlock()
	// A spawner that joins now shows a failure here, not at the next
	// command; it serves the current phase from now on.
	sp, err := newSpawner(s.cfg.Root, s.files, s.cfg.DropAdmin, s.cfg.CommandFilter, fds)
	if err != nil {
		closeFDs(fds)
		s.writeError(w, r, fmt.Errorf("place commands: %w", err))
		return
	}
	if s.spawner != nil {
		s.spawner.stop()
	}
	closeFDs(s.cmdTasks)
	s.spawner, s.cmdTasks = sp, fds
	writeJSON(w, http.StatusOK, struct{}{})
}

// maxCommandCgroups bounds the commands' cgroups (one per cgroup v1
// hierarchy the edge limits them in: cpu and pids today).
const maxCommandCgroups = 4

// checkTasksFiles checks that fds are 1 to maxCommandCgroups cgroup v1
// files.
func checkTasksFiles(fds []int) error {
	if len(fds) < 1 || len(fds) > maxCommandCgroups {
		return errdefs.Invalid("want 1 to %d cgroup tasks file descriptors, got %d", maxCommandCgroups, len(fds))
	}
	for _, fd := range fds {
		var st unix.Statfs_t
		if err := unix.Fstatfs(fd, &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
			return errdefs.Invalid("a descriptor is not a cgroup v1 file")
		}
	}
	return nil
}

// PlaceCommands hands the agent behind conn (a unix socket) the tasks
// files of the cgroup v1 cgroups its commands are to run in (see
// handlePlaceCommands). conn is closed. Agents before the pids cgroup
// take exactly one (cpu).
func PlaceCommands(ctx context.Context, conn net.Conn, tasks ...int) error {
	defer conn.Close()
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("place commands: not a unix socket")
	}
	if d, ok := ctx.Deadline(); ok {
		uc.SetDeadline(d)
	} else {
		uc.SetDeadline(time.Now().Add(30 * time.Second))
	}
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Now()) })
	defer stop()
	req := "POST /cgroup HTTP/1.1\r\nHost: " + agentHost + "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
	if _, _, err := uc.WriteMsgUnix([]byte(req), unix.UnixRights(tasks...), nil); err != nil {
		return fmt.Errorf("place commands: send: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(uc), nil)
	if err != nil {
		return fmt.Errorf("place commands: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("place commands: agent answered %s: %s", resp.Status, body)
	}
	return nil
}
