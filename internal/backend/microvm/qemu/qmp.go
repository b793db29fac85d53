package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/backend/microvm"
)

// qmp runs one QMP command on the control socket of a machine and decodes
// its return value into out (if not nil). Each call uses a connection of
// its own: QEMU serves one QMP client at a time, and a restarted edge
// must find the socket free.
func qmp(ctx context.Context, sock, command string, args, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return qmpSession(ctx, sock, func(run func(command string, args, out any) error) error {
		return run(command, args, out)
	})
}

// qmpSession opens one QMP connection, negotiates capabilities and hands
// f a function that runs commands on it, until f returns or ctx ends.
func qmpSession(ctx context.Context, sock string, f func(run func(command string, args, out any) error) error) error {
	return qmpSessionFD(ctx, sock, nil, f)
}

// qmpSessionFD is qmpSession whose first command after the greeting
// carries fd (SCM_RIGHTS): "getfd", which names it for later commands of
// the session.
func qmpSessionFD(ctx context.Context, sock string, fd *os.File, f func(run func(command string, args, out any) error) error) error {
	c, err := microvm.DialUnix(ctx, sock)
	if err != nil {
		return fmt.Errorf("qmp: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	r := bufio.NewReader(c)
	enc := json.NewEncoder(c)
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := readMsg(r, &greeting); err != nil {
		return fmt.Errorf("qmp: greeting: %w", err)
	}
	if greeting.QMP == nil {
		return fmt.Errorf("qmp: no greeting")
	}
	passFD := fd
	run := func(name string, args, out any) error {
		req := map[string]any{"execute": name}
		if args != nil {
			req["arguments"] = args
		}
		if passFD != nil && name == "getfd" {
			uc, ok := c.(*net.UnixConn)
			if !ok {
				return fmt.Errorf("qmp %s: not a unix socket", name)
			}
			b, err := json.Marshal(req)
			if err != nil {
				return err
			}
			if _, _, err := uc.WriteMsgUnix(append(b, '\n'), unix.UnixRights(int(passFD.Fd())), nil); err != nil {
				return fmt.Errorf("qmp %s: %w", name, err)
			}
			passFD = nil
		} else if err := enc.Encode(req); err != nil {
			return fmt.Errorf("qmp %s: %w", name, err)
		}
		for {
			var resp struct {
				Return json.RawMessage `json:"return"`
				Error  *struct {
					Class string `json:"class"`
					Desc  string `json:"desc"`
				} `json:"error"`
				Event string `json:"event"`
			}
			if err := readMsg(r, &resp); err != nil {
				return fmt.Errorf("qmp %s: %w", name, err)
			}
			if resp.Event != "" {
				continue
			}
			if resp.Error != nil {
				return &qmpError{cmd: name, class: resp.Error.Class, desc: resp.Error.Desc}
			}
			if out != nil {
				if err := json.Unmarshal(resp.Return, out); err != nil {
					return fmt.Errorf("qmp %s: %w", name, err)
				}
			}
			return nil
		}
	}
	if err := run("qmp_capabilities", nil, nil); err != nil {
		return err
	}
	return f(run)
}

func readMsg(r *bufio.Reader, v any) error {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return err
	}
	return json.Unmarshal(line, v)
}

// qmpError is an error QEMU answered with, as opposed to a failure to
// reach it.
type qmpError struct{ cmd, class, desc string }

func (e *qmpError) Error() string { return fmt.Sprintf("qmp %s: %s: %s", e.cmd, e.class, e.desc) }
