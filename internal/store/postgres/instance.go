package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Instance is a private PostgreSQL server in a directory of its own,
// listening only on a unix socket there: for tests and benchmarks, which
// must not share a database (or a port) with anything else on the
// machine.
type Instance struct {
	Dir string
	// DSN connects to its "postgres" database as the superuser "dsec".
	DSN string
	cmd *exec.Cmd
}

// FindBin returns the directory of PostgreSQL's server binaries (Debian
// keeps them in /usr/lib/postgresql/<version>/bin), or an error saying
// what to install.
func FindBin() (string, error) {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(matches) == 0 {
		if p, err := exec.LookPath("postgres"); err == nil {
			return filepath.Dir(p), nil
		}
		return "", errors.New("no PostgreSQL server found: apt-get install postgresql")
	}
	return filepath.Dir(matches[len(matches)-1]), nil
}

// StartInstance initialises a database cluster in dir (which must not
// exist or be empty) and starts a server on it. PostgreSQL refuses to run
// as root, so under root the server runs as the "postgres" user the
// Debian package creates. fast trades durability for speed (fsync off),
// for tests.
func StartInstance(ctx context.Context, dir string, fast bool) (*Instance, error) {
	bin, err := FindBin()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("PostgreSQL cannot run as root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	run := func(name string, args ...string) *exec.Cmd {
		c := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
		c.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
		c.Dir = dir
		c.Env = append(os.Environ(), "LC_ALL=C")
		return c
	}
	if out, err := run("initdb", "-D", data, "-U", "dsec", "-A", "trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	port := 20000 + rand.IntN(20000)
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=",
		"-c", "max_connections=200", "-c", "shared_buffers=256MB"}
	if fast {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	log, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := run("postgres", args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	in := &Instance{Dir: dir, cmd: cmd,
		DSN: fmt.Sprintf("host=%s port=%d user=dsec dbname=postgres sslmode=disable", dir, port)}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := pgx.Connect(ctx, in.DSN)
		if err == nil {
			c.Close(ctx)
			return in, nil
		}
		if time.Now().After(deadline) {
			in.Stop()
			b, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			return nil, fmt.Errorf("postgres did not start: %v\n%s", err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CreateDatabase makes an empty database and returns its DSN.
func (in *Instance) CreateDatabase(ctx context.Context, name string) (string, error) {
	c, err := pgx.Connect(ctx, in.DSN)
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	cfg, _ := pgx.ParseConfig(in.DSN)
	return fmt.Sprintf("host=%s port=%d user=dsec dbname=%s sslmode=disable", cfg.Host, cfg.Port, name), nil
}

// Stop shuts the server down (fast shutdown: it aborts open transactions)
// and waits for it. It leaves the directory.
func (in *Instance) Stop() {
	if in.cmd.Process == nil {
		return
	}
	in.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { in.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		syscall.Kill(-in.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// CPUTime is the CPU time (user and system) the server's processes now
// running have used: the postmaster and its children (backends, WAL
// writer, checkpointer…; each is a session of its own, so they are found
// by parent).
func (in *Instance) CPUTime() time.Duration {
	if in.cmd.Process == nil {
		return 0
	}
	pm := in.cmd.Process.Pid
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// Fields after the command, which is in parentheses and may hold
		// spaces: state ppid pgrp … utime (14th field) stime (15th).
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 13 {
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(filepath.Dir(p)), "/"))
		if ppid, _ := strconv.Atoi(f[1]); ppid != pm && pid != pm {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + st
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ is 100 on Linux
}
