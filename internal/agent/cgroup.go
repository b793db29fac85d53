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

// handlePlaceCommands takes the "tasks" file of a cgroup v1 cpu cgroup
// (one descriptor, SCM_RIGHTS, opened by the edge: the write permission is
// the opener's) and starts every later command in that cgroup, by forking
// it from a spawner thread that joined it. The agent's own threads stay
// where they are: the sandbox's CPU quota is on the commands' cgroup, so
// the agent serving an exec is never throttled by it.
//
// It answers once a spawner has joined the cgroup: on an error the commands
// stay in the agent's cgroup and the edge puts the quota back there.
func (s *Server) handlePlaceCommands(w http.ResponseWriter, r *http.Request) {
	fds := receivedFDs(r)
	if len(fds) != 1 {
		closeFDs(fds)
		s.writeError(w, r, errdefs.Invalid("place commands needs one cgroup tasks file descriptor, got %d", len(fds)))
		return
	}
	fd := fds[0]
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
		unix.Close(fd)
		s.writeError(w, r, errdefs.Invalid("place commands: the descriptor is not a cgroup v1 file"))
		return
	}
	if s.noConfine {
		unix.Close(fd)
		s.writeError(w, r, errdefs.Invalid("place commands: this agent forks commands from the calling thread"))
		return
	}
	s.policyMu.Lock()
	defer s.policyMu.Unlock()
	// A spawner that joins now shows a failure here, not at the next
	// command; it serves the current phase from now on.
	sp, err := newSpawner(s.cfg.Root, s.files, s.cfg.DropAdmin, s.cfg.CommandFilter, fd)
	if err != nil {
		unix.Close(fd)
		s.writeError(w, r, fmt.Errorf("place commands: %w", err))
		return
	}
	if s.spawner != nil {
		s.spawner.stop()
	}
	if s.cmdTasks >= 0 {
		unix.Close(s.cmdTasks)
	}
	s.spawner, s.cmdTasks = sp, fd
	writeJSON(w, http.StatusOK, struct{}{})
}

// PlaceCommands hands the agent behind conn (a unix socket) the tasks file
// of the cgroup v1 cpu cgroup its commands are to run in (see
// handlePlaceCommands). conn is closed.
func PlaceCommands(ctx context.Context, conn net.Conn, tasks int) error {
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
	if _, _, err := uc.WriteMsgUnix([]byte(req), unix.UnixRights(tasks), nil); err != nil {
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
