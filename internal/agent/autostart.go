package agent

import (
	"fmt"
	"os"
	"path"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
)

// AutostartDir holds the programs a sandbox's layers want running from
// the start (the desktop toolkit's X server, window manager and
// terminal): the agent, as the sandbox's init, starts each executable
// file in it, in name order, as a background process tagged
// "autostart:NAME" (GET /procs lists them with their output). It runs
// them again after a reset, which kills every process.
const AutostartDir = "/etc/dsec/autostart.d"

// Autostart starts the executables in dir (resolved beneath the root) and
// returns the processes started. A missing dir is no error.
func (s *Server) Autostart(dir string) ([]api.Process, error) {
	fd, err := s.openIn(dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, nil
	}
	f := os.NewFile(uintptr(fd), dir)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("autostart: read %s: %w", dir, err)
	}
	slices.Sort(names)
	var started []api.Process
	for _, name := range names {
		p := path.Join(dir, name)
		var st unix.Stat_t
		efd, err := s.openIn(p, unix.O_PATH)
		if err != nil {
			continue
		}
		err = unix.Fstat(efd, &st)
		unix.Close(efd)
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0 {
			continue
		}
		spec, err := prepare(&api.ExecRequest{Cmd: []string{p}, Background: true, Tag: "autostart:" + name, Cwd: "/"})
		if err != nil {
			return started, fmt.Errorf("autostart %s: %w", p, err)
		}
		v, err := s.startBackground(spec)
		if err != nil {
			return started, fmt.Errorf("autostart %s: %w", p, err)
		}
		s.cfg.Log.Info("autostart", "path", p, "process", v.ID, "pid", v.Pid)
		started = append(started, v)
	}
	return started, nil
}
