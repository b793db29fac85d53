// Command dsec-agent is the executor inside a sandbox: PID 1 of its
// container, serving the agent API (package internal/agent) on a socket
// the edge hands it as an inherited file descriptor.
//
//	dsec-agent --listen-fd 3            # in a sandbox (runc --preserve-fds 1)
//	dsec-agent --listen /tmp/a.sock --root /tmp/root   # tests
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/dsec-project/dsec/internal/agent"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	var (
		listenFD = flag.Int("listen-fd", -1, "serve on this inherited listening socket `fd`")
		listen   = flag.String("listen", "", "serve on a new unix socket at this `path`")
		root     = flag.String("root", "/", "resolve file operations beneath this `dir`")
		maxFile  = flag.Int64("max-file-bytes", 100<<20, "largest file read or written through the API")
		logMax   = flag.Int64("log-max-bytes", 1<<20, "stop logging after this many bytes")
		grace    = flag.Duration("shutdown-grace", 0, "time between a forwarded signal and SIGKILL (0: the default, 2s)")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(agent.NewLogWriter(os.Stderr, *logMax), nil)).With("component", "agent")
	if err := run(log, *listenFD, *listen, agent.Config{
		Root:          *root,
		MaxFileBytes:  *maxFile,
		ShutdownGrace: *grace,
		Version:       version,
		Log:           log,
	}); err != nil {
		log.Error("dsec-agent failed", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, fd int, path string, cfg agent.Config) error {
	l, err := listener(fd, path)
	if err != nil {
		return err
	}
	srv, err := agent.New(cfg)
	if err != nil {
		l.Close()
		return err
	}
	defer srv.Close()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	go func() { srv.Shutdown(<-sigs) }()
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("stopped")
	return nil
}

// listener is the inherited socket at fd, or a new one at path.
func listener(fd int, path string) (net.Listener, error) {
	switch {
	case fd >= 0 && path != "":
		return nil, errors.New("set one of --listen-fd and --listen")
	case fd >= 0:
		f := os.NewFile(uintptr(fd), "listener")
		// FileListener dups the socket close-on-exec; closing the original
		// keeps it out of every child.
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("listen on fd %d: %w", fd, err)
		}
		return l, nil
	case path != "":
		l, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w", path, err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			l.Close()
			return nil, fmt.Errorf("listen on %s: %w", path, err)
		}
		return l, nil
	}
	return nil, errors.New("one of --listen-fd and --listen is required")
}
