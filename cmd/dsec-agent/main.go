// Command dsec-agent is the executor inside a sandbox: PID 1 of its
// container, serving the agent API (package internal/agent) on a socket
// the edge hands it as an inherited file descriptor; or the init of a
// microVM, which first builds the sandbox's root (package guestinit) and
// then serves on the VM's link to the host.
//
//	dsec-agent --listen-fd 3 --seccomp /.dsec/seccomp   # in a sandbox (runc --preserve-fds 1)
//	/init                                                # as a microVM's init (or --vm-init)
//	dsec-agent --vm-service                              # a unit of a full VM (fullvm backend)
//	dsec-agent --listen /tmp/a.sock --root /tmp/root     # tests
//
// With --seccomp, before anything else it loads DIR/agent.bpf on all its
// threads and runs every command under DIR/command.bpf too: the container
// is started without a seccomp section, so that runc does not compile
// Docker's profile on every start (the edge compiles both once per node).
// It can then also reset its sandbox in place (POST /reset), re-executing
// itself with --state-fd.
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
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/guestinit"
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
		vmInit   = flag.Bool("vm-init", false, "run as a microVM's init: build the root, serve on the host link (implied as PID 1 named /init)")
		vmSvc    = flag.Bool("vm-service", false, "run as a unit of a full VM's own init: read the config drive, serve on the host link")
		filters  = flag.String("seccomp", "", "load `dir`/agent.bpf now and run commands under dir/command.bpf")
		stateFD  = flag.Int("state-fd", -1, "read the state a resetting agent handed over from this `fd`")
		maxPorts = flag.Int("max-port-conns", agent.DefaultMaxPortConns, "connections open at once to the sandbox's ports")
		ownProcs = flag.Bool("own-gomaxprocs", false, "$GOMAXPROCS was set for the agent alone: unset it before any command can inherit it")
	)
	flag.Parse()
	if *ownProcs {
		os.Unsetenv("GOMAXPROCS")
	}
	// One P: the agent's work is short handlers and pumps waiting on
	// sockets and pipes, and on a node of thousands of sandboxes a second
	// P per agent only buys wakeups of idle threads (each exec readies
	// several goroutines: Go would wake a spinning thread for each). With
	// one, a warm exec took ~20% less of the agent's CPU. $GOMAXPROCS
	// still overrides it. The edge starts the agent with GOMAXPROCS=1
	// and --own-gomaxprocs (unless the sandbox's own environment has a
	// GOMAXPROCS), so that the runtime has one P from its first
	// instruction: started with one per core and cut to one here, an
	// idle agent kept up to ~0.5 MiB more (the second P's cached spans
	// and what ran on it during start-up).
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	cfg := agent.Config{Root: *root, MaxFileBytes: *maxFile, ShutdownGrace: *grace, Version: version, MaxPortConns: *maxPorts}
	if err := confine(&cfg, *filters, *stateFD); err != nil {
		fmt.Fprintln(os.Stderr, "dsec-agent:", err)
		os.Exit(1)
	}
	log := slog.New(slog.NewTextHandler(agent.NewLogWriter(os.Stderr, *logMax), nil)).With("component", "agent")
	if *vmInit || (os.Getpid() == 1 && os.Args[0] == "/init") {
		if err := runVM(log, *grace); err != nil {
			// Init exiting panics the guest kernel, which stops the VM: the
			// host sees a failed sandbox.
			log.Error("dsec-agent (vm init) failed", "err", err)
			os.Exit(1)
		}
		return
	}
	if *vmSvc {
		if err := runVMService(log, *grace); err != nil {
			log.Error("dsec-agent (full VM) failed", "err", err)
			os.Exit(1)
		}
		return
	}
	cfg.Log = log
	if *filters != "" && *listenFD >= 0 && *stateFD < 0 && os.Getpid() == 1 {
		// A container sandbox's first agent, its init (a re-executed
		// one has them in its new root already; an agent that is not
		// an init is not a container's and mounts nothing).
		if err := agent.FinishContainer(); err != nil {
			log.Error("dsec-agent: finish the container", "err", err)
			os.Exit(1)
		}
	}
	if *filters != "" && *listenFD >= 0 {
		cfg.Reexec = func(listenFD, stateFD int) error {
			args := []string{os.Args[0], "--listen-fd", strconv.Itoa(listenFD), "--state-fd", strconv.Itoa(stateFD),
				"--root", *root, "--max-file-bytes", strconv.FormatInt(*maxFile, 10), "--log-max-bytes", strconv.FormatInt(*logMax, 10),
				"--shutdown-grace", grace.String(), "--seccomp", *filters, "--max-port-conns", strconv.Itoa(*maxPorts)}
			env := os.Environ()
			if _, set := os.LookupEnv("GOMAXPROCS"); !set {
				// One P from the start for the new agent too (see above).
				env = append(env, "GOMAXPROCS=1")
				args = append(args, "--own-gomaxprocs")
			}
			// The same path: /.dsec is a read-only bind the new root has too.
			return syscall.Exec(os.Args[0], args, env)
		}
	}
	if err := run(log, *listenFD, *listen, cfg); err != nil {
		log.Error("dsec-agent failed", "err", err)
		os.Exit(1)
	}
}

// runVM builds the sandbox inside a microVM and serves on its host link.
func runVM(log *slog.Logger, grace time.Duration) error {
	cfg, freezer, err := guestinit.Boot(log)
	if err != nil {
		return err
	}
	l, err := guestinit.Listen(cfg, log)
	if err != nil {
		return err
	}
	return serve(log, l, agent.Config{
		Root: "/", MaxFileBytes: cfg.MaxFileBytes, ShutdownGrace: grace, Version: version, Log: log,
		Freezer: freezer, Identity: true,
	})
}

// runVMService serves on the host link of a full VM, whose own init
// (systemd) runs the agent as a unit.
func runVMService(log *slog.Logger, grace time.Duration) error {
	cfg, freezer, err := guestinit.Service(log)
	if err != nil {
		return err
	}
	l, err := guestinit.Listen(cfg, log)
	if err != nil {
		return err
	}
	return serve(log, l, agent.Config{
		Root: "/", MaxFileBytes: cfg.MaxFileBytes, ShutdownGrace: grace, Version: version, Log: log,
		Freezer: freezer,
	})
}

func run(log *slog.Logger, fd int, path string, cfg agent.Config) error {
	l, err := listener(fd, path)
	if err != nil {
		return err
	}
	return serve(log, l, cfg)
}

func serve(log *slog.Logger, l net.Listener, cfg agent.Config) error {
	srv, err := agent.New(cfg)
	if err != nil {
		l.Close()
		return err
	}
	defer srv.Close()
	// The layers' own services (the desktop toolkit's X server): the
	// agent is the sandbox's init, here and after each reset.
	if _, err := srv.Autostart(agent.AutostartDir); err != nil {
		log.Warn("autostart", "err", err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	go func() { srv.Shutdown(<-sigs) }()
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("stopped")
	return nil
}

// confine loads the agent's seccomp filter (unless the agent it replaces
// on a reset already did: filters outlive exec) and the commands' one.
// It runs before the agent does anything else.
func confine(cfg *agent.Config, dir string, stateFD int) error {
	if stateFD >= 0 {
		c, err := agent.ReadCarried(stateFD)
		if err != nil {
			return err
		}
		cfg.Carried, cfg.Filtered = c, c.Filtered
	}
	if dir == "" {
		return nil
	}
	if !cfg.Filtered {
		prog, err := os.ReadFile(filepath.Join(dir, "agent.bpf"))
		if err != nil {
			return err
		}
		if err := agent.LoadSeccomp(prog, true); err != nil {
			return err
		}
		cfg.Filtered = true
	}
	prog, err := os.ReadFile(filepath.Join(dir, "command.bpf"))
	if err != nil {
		return err
	}
	cfg.CommandFilter, cfg.DropAdmin = prog, true
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
