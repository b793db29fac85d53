package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/dsec-project/dsec/internal/backend/microvm"
)

// qmp runs one QMP command on the control socket of a machine and decodes
// its return value into out (if not nil). Each call uses a connection of
// its own: QEMU serves one QMP client at a time, and a restarted edge
// must find the socket free.
func qmp(ctx context.Context, sock, command string, args, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := microvm.DialUnix(ctx, sock)
	if err != nil {
		return fmt.Errorf("qmp %s: %w", command, err)
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
		return fmt.Errorf("qmp %s: greeting: %w", command, err)
	}
	if greeting.QMP == nil {
		return fmt.Errorf("qmp %s: no greeting", command)
	}
	for _, cmd := range []struct {
		name string
		args any
		out  any
	}{{"qmp_capabilities", nil, nil}, {command, args, out}} {
		req := map[string]any{"execute": cmd.name}
		if cmd.args != nil {
			req["arguments"] = cmd.args
		}
		if err := enc.Encode(req); err != nil {
			return fmt.Errorf("qmp %s: %w", cmd.name, err)
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
				return fmt.Errorf("qmp %s: %w", cmd.name, err)
			}
			if resp.Event != "" {
				continue
			}
			if resp.Error != nil {
				return &qmpError{cmd: cmd.name, class: resp.Error.Class, desc: resp.Error.Desc}
			}
			if cmd.out != nil {
				if err := json.Unmarshal(resp.Return, cmd.out); err != nil {
					return fmt.Errorf("qmp %s: %w", cmd.name, err)
				}
			}
			break
		}
	}
	return nil
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
