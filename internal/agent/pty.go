package agent

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// defaultTerm is $TERM of a command on a terminal that names none.
const defaultTerm = "xterm-256color"

func checkTTYSize(rows, cols int) error {
	if rows < 1 || rows > api.MaxTTYSize || cols < 1 || cols > api.MaxTTYSize {
		return errdefs.Invalid("tty size %dx%d: rows and cols must be in [1, %d]", rows, cols, api.MaxTTYSize)
	}
	return nil
}

// openTerminal opens a pseudo-terminal of the given size: the child gets
// its terminal side as stdin, stdout and stderr; the agent reads and
// writes the master side.
//
// It opens /dev/ptmx itself rather than through creack/pty, whose Open
// puts the master in blocking mode (it takes its Fd): read deadlines,
// which drain relies on, then no longer work.
func openTerminal(size *api.TTYSize) (_ *stdio, err error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open pseudo-terminal: %w", err)
	}
	defer func() {
		if err != nil {
			master.Close()
		}
	}()
	var n int
	if err := control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return err
		}
		var err error
		n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN)
		return err
	}); err != nil {
		return nil, fmt.Errorf("unlock pseudo-terminal: %w", err)
	}
	if err := setSize(master, size.Rows, size.Cols); err != nil {
		return nil, err
	}
	slave, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open pseudo-terminal: %w", err)
	}
	fd := int(slave.Fd()) // blocking, as the child needs it
	return &stdio{child: [3]int{fd, fd, fd}, childFile: slave, stdout: master, pty: master}, nil
}

// control runs fn on f's descriptor without taking f out of the poller.
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// setSize sets a terminal's window size; the kernel sends SIGWINCH to its
// foreground process group.
func setSize(master *os.File, rows, cols int) error {
	if err := checkTTYSize(rows, cols); err != nil {
		return err
	}
	ws := &unix.Winsize{Row: uint16(rows), Col: uint16(cols)}
	if err := control(master, func(fd int) error { return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, ws) }); err != nil {
		return fmt.Errorf("set terminal size: %w", err)
	}
	return nil
}

// foreground is the terminal's foreground process group.
func foreground(master *os.File) (int, error) {
	var pgrp int
	err := control(master, func(fd int) error {
		var err error
		pgrp, err = unix.IoctlGetInt(fd, unix.TIOCGPGRP)
		return err
	})
	return pgrp, err
}

// killSession kills what is left of the session sid: the processes a
// terminal's shell started in other process groups (jobs) and left
// behind. Closing a terminal ends its session.
func killSession(sid int) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if s, err := unix.Getsid(pid); err == nil && s == sid {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

func killGroup(pgrp int, sig unix.Signal) error { return unix.Kill(-pgrp, sig) }
