package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// ErrNoReset means the agent cannot reset in place (an older agent, or one
// that is not PID 1 of a container): the caller restarts the sandbox.
var ErrNoReset = errors.New("agent cannot reset in place")

// ResetRoot asks the agent behind conn (a unix socket) to reset its
// sandbox in place onto root, a detached mount it receives with the
// request (SCM_RIGHTS). When it returns nil, the agent has killed every
// process and switched roots, and is re-executing: the next connection
// reaches the new agent. conn is closed. id, if not nil, is the identity
// the sandbox takes on (a blank sandbox of the pool becoming a tenant's).
// tasks, if any, are the tasks files of the commands' cgroup v1 cgroups
// (cpu, pids), sent along for a kept agent to take (see PlaceCommands;
// the result's CommandsPlaced says whether it did). Agents before them
// refuse descriptors beyond the root, and those before the pids cgroup
// more than one: only a claim, whose blank this edge started, sends them.
func ResetRoot(ctx context.Context, conn net.Conn, root int, tasks []int, id *ResetIdentity) (*ResetResult, error) {
	defer conn.Close()
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("reset: %w: not a unix socket", ErrNoReset)
	}
	if d, ok := ctx.Deadline(); ok {
		uc.SetDeadline(d)
	} else {
		uc.SetDeadline(time.Now().Add(time.Minute))
	}
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Now()) })
	defer stop()
	var body []byte
	if id != nil {
		var err error
		if body, err = json.Marshal(id); err != nil {
			return nil, fmt.Errorf("reset: %w", err)
		}
	}
	req := "POST /reset HTTP/1.1\r\nHost: " + agentHost + "\r\nContent-Length: " + strconv.Itoa(len(body)) +
		"\r\nConnection: close\r\n\r\n" + string(body)
	fds := append([]int{root}, tasks...)
	if _, _, err := uc.WriteMsgUnix([]byte(req), unix.UnixRights(fds...), nil); err != nil {
		return nil, fmt.Errorf("reset: send: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(uc), nil)
	if err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusBadRequest {
		return nil, fmt.Errorf("reset: %w: %s", ErrNoReset, body)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reset: agent answered %s: %s: %w", resp.Status, body, errdefs.ErrUnavailable)
	}
	var res ResetResult
	if err := json.Unmarshal(body, &res); err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	return &res, nil
}
