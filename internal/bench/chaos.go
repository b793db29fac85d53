package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/blobfs"
)

// ChaosConfig sets up `dsec bench chaos`.
type ChaosConfig struct {
	Duration time.Duration
	Base     string
	// Bin is the dsec binary the server runs from; Agent the dsec-agent.
	Bin, Agent string
	// WorkDir holds the server's data directory, removed at the end.
	WorkDir string
	// Workers are concurrent load loops; MaxLive caps the sandboxes they
	// keep.
	Workers, MaxLive int
	// KillEvery is the mean time between kills (each wait is uniform in
	// [KillEvery/2, 3·KillEvery/2]).
	KillEvery time.Duration
	Out       io.Writer
}

// chaosExecTimeout is the exec's own timeout; chaosGrace what an answer
// may take beyond it before it counts as a hang.
const (
	chaosExecTimeout = 30 * time.Second
	chaosGrace       = 60 * time.Second
)

// Chaos starts an all-in-one `dsec server` of its own as a child process,
// runs mixed load against it while a chaos loop kill -9s the server (which
// holds the edge: the all-in-one has no separate edge process), the blobfs
// worker and random sandboxes' agents at random intervals, restarting the
// server, and at the end checks the invariants: every sandbox a create
// answered for exists and runs a command or was deleted on request; every
// exec answer is byte-exact or a retryable error, none hangs past its
// deadline; once every sandbox is deleted, nothing is left (mounts,
// cgroups, processes, loop devices, sandbox directories).
func Chaos(ctx context.Context, cfg ChaosConfig) error {
	w := cfg.Out
	data, err := os.MkdirTemp(cfg.WorkDir, "dsec-chaos-")
	if err != nil {
		return err
	}
	srv := &chaosServer{bin: cfg.Bin, data: data, parent: "dsec-chaos-" + filepath.Base(data)}
	port, err := freePort()
	if err != nil {
		return err
	}
	srv.args = []string{"server", "--data", data, "--listen", "127.0.0.1:" + strconv.Itoa(port),
		"--node-id", "chaos-node", "--agent", cfg.Agent, "--cgroup-parent", srv.parent, "--disk-overcommit", "1000"}
	fmt.Fprintf(w, "dsec bench chaos: %s of mixed load, %d loops, ≤%d live sandboxes, a kill every ~%s; data %s\n",
		cfg.Duration, cfg.Workers, cfg.MaxLive, cfg.KillEvery, data)
	fmt.Fprintln(w, "the all-in-one server holds the edge: a server kill is an edge kill")
	if err := srv.start(ctx); err != nil {
		return err
	}
	defer srv.teardown()

	l := newChaosLedger(time.Now())
	ck := &chaosLoad{cfg: cfg, srv: srv, l: l, req: &api.CreateSandboxRequest{
		Layers: &api.LayerRefs{Base: cfg.Base}, Resources: api.Resources{CPU: 0.25, MemoryMB: 64}}}
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	var wg sync.WaitGroup
	for i := range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ck.loop(runCtx, rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(i))))
		}()
	}
	kills := map[string]int{}
	var killMu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 99))
		for {
			wait := cfg.KillEvery/2 + time.Duration(r.Int64N(int64(cfg.KillEvery)+1))
			select {
			case <-runCtx.Done():
				return
			case <-time.After(wait):
			}
			what, err := ck.kill(ctx, runCtx, r)
			if err != nil {
				l.violate("chaos: %s: %v", what, err)
			}
			killMu.Lock()
			kills[what]++
			killMu.Unlock()
		}
	}()
	wg.Wait()
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	fmt.Fprintf(w, "kills (kill -9):")
	for _, k := range sortedKeys(kills) {
		fmt.Fprintf(w, " %s %d,", k, kills[k])
	}
	fmt.Fprintln(w)

	// The end: the server must be up (restart it if a kill was the last
	// thing), then every sandbox answered for must exist and work.
	if err := srv.ensureUp(ctx); err != nil {
		return err
	}
	c := srv.client()
	// Deletes whose answers were lost are asked again, as a client would.
	for _, id := range ck.undeleted {
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Minute)
		if err := c.DeleteSandbox(dctx, id); err != nil && !client.IsNotFound(err) {
			l.violate("delete %s again at the end: %v", id, err)
		}
		dcancel()
	}
	exists, works := map[string]bool{}, map[string]bool{}
	listed, err := listAll(ctx, c)
	if err != nil {
		return fmt.Errorf("chaos: list sandboxes at the end: %w", err)
	}
	for _, sb := range listed {
		exists[sb.ID] = true
	}
	live := l.live()
	var wmu sync.Mutex
	var cw sync.WaitGroup
	for _, id := range live {
		if !exists[id] {
			continue
		}
		cw.Add(1)
		go func() {
			defer cw.Done()
			// A sandbox whose agent was killed may be being repaired: give
			// it a while.
			var err error
			for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(2 * time.Second) {
				octx, ocancel := context.WithTimeout(ctx, chaosGrace)
				var res *api.ExecResult
				res, err = c.Exec(octx, id, &api.ExecRequest{Shell: "echo alive", TimeoutMs: 10000})
				ocancel()
				if err == nil {
					v := execVerdict("alive\n", res, res.Stdout)
					if v == "" {
						wmu.Lock()
						works[id] = true
						wmu.Unlock()
						return
					}
					err = errors.New(v)
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					break
				}
			}
			sb, gerr := c.GetSandbox(ctx, id)
			state := "?"
			if gerr == nil {
				state = sb.State
			}
			fmt.Fprintf(w, "sandbox %s (state %s) does not run a command: %v\n", id, state, err)
		}()
	}
	cw.Wait()
	l.checkSurvivors(exists, works)
	ck.checkTrajs(ctx, c, works)
	unanswered := 0
	for _, sb := range listed {
		if _, ok := l.sandboxes[sb.ID]; !ok {
			unanswered++
		}
	}
	fmt.Fprintf(w, "at the end: %d sandboxes answered for, %d of them live; %d listed, of which %d work and %d were made by a create whose answer was lost (deleted now)\n",
		len(l.sandboxes), len(live), len(listed), len(works), unanswered)

	// Delete everything, then nothing may be left.
	for _, sb := range listed {
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Minute)
		if err := c.DeleteSandbox(dctx, sb.ID); err != nil && !client.IsNotFound(err) {
			l.violate("delete %s at the end: %v", sb.ID, err)
		}
		dcancel()
	}
	var leaks []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		if leaks = srv.leaks(); len(leaks) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, lk := range leaks {
		l.violate("left behind after every sandbox was deleted: %s", lk)
	}
	if n := l.report(w); n > 0 {
		fmt.Fprintf(w, "server log kept: %s\n", filepath.Join(data, "server.log"))
		srv.keep = true
		return fmt.Errorf("chaos: %d invariant violations", n)
	}
	return nil
}

func listAll(ctx context.Context, c *client.Client) ([]api.Sandbox, error) {
	var out []api.Sandbox
	o := client.ListOptions{Limit: 1000}
	for {
		page, err := c.ListSandboxes(ctx, o)
		if err != nil {
			return nil, err
		}
		out = append(out, page.Sandboxes...)
		if page.NextPageToken == "" {
			return out, nil
		}
		o.PageToken = page.NextPageToken
	}
}

// chaosLoad is the load: each loop picks an operation at random.
type chaosLoad struct {
	cfg ChaosConfig
	srv *chaosServer
	l   *chaosLedger
	req *api.CreateSandboxRequest

	mu   sync.Mutex
	pool []string // live sandboxes the loops work on
	// undeleted are sandboxes whose delete got no answer, to retry.
	undeleted []string
	snapNo    int
	// trajs are the trajectories, each in a sandbox of its own outside
	// the pool.
	trajs []*chaosTraj
}

// chaosMaxTrajs caps the trajectories (and their sandboxes).
const chaosMaxTrajs = 3

func (ck *chaosLoad) pick(r *rand.Rand) string {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	if len(ck.pool) == 0 {
		return ""
	}
	return ck.pool[r.IntN(len(ck.pool))]
}

func (ck *chaosLoad) add(id string) {
	ck.l.created(id)
	ck.mu.Lock()
	ck.pool = append(ck.pool, id)
	ck.mu.Unlock()
}

func (ck *chaosLoad) remove(id string) {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	for i, x := range ck.pool {
		if x == id {
			ck.pool = append(ck.pool[:i], ck.pool[i+1:]...)
			return
		}
	}
}

func (ck *chaosLoad) size() int {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	return len(ck.pool)
}

// op runs fn with the operation's deadline and records its outcome; fn
// returns an error of the API or of the check (a violation, recorded by
// fn itself, returns nil).
func (ck *chaosLoad) op(ctx context.Context, name, id string, limit time.Duration, fn func(ctx context.Context) error) {
	octx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	t0 := time.Now()
	err := fn(octx)
	if ctx.Err() != nil { // the run ended under it: not an answer
		return
	}
	if err == nil {
		ck.l.done(name, time.Since(t0), time.Now())
		return
	}
	if octx.Err() != nil {
		err = fmt.Errorf("%w: %v", errDeadline, err)
	}
	ck.l.failed(name, id, err)
	if errCode(err) == "transport" {
		// The server is down: wait a little for it, as a client would,
		// rather than spin on refused connections.
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (ck *chaosLoad) loop(ctx context.Context, r *rand.Rand) {
	for ctx.Err() == nil {
		c := ck.srv.client()
		n, id := ck.size(), ck.pick(r)
		switch x := r.IntN(100); {
		case n < 2 || id == "" || (x < 10 && n < ck.cfg.MaxLive):
			ck.op(ctx, "create", "", 2*time.Minute, func(ctx context.Context) error {
				sb, err := c.CreateSandbox(ctx, ck.req)
				if err == nil {
					ck.add(sb.ID)
				}
				return err
			})
		case x < 15 && n+3 <= ck.cfg.MaxLive:
			ck.op(ctx, "batch create", "", 3*time.Minute, func(ctx context.Context) error {
				res, err := c.CreateBatch(ctx, &api.BatchCreateRequest{Count: 3, CreateSandboxRequest: *ck.req}, nil)
				if err != nil {
					return err
				}
				var itemErr error
				for _, it := range res.Items {
					if it.ID != "" && it.Error == nil {
						ck.add(it.ID)
					} else if it.ID != "" {
						// Answered with an id, failed: it must still be
						// deletable; track it so the end deletes it.
						ck.l.created(it.ID)
						ck.l.mu.Lock()
						ck.l.sandboxes[it.ID] = true // not expected to work
						ck.l.mu.Unlock()
					}
					if it.Error != nil {
						itemErr = it.Error
					}
				}
				return itemErr
			})
		case ck.retryDelete(ctx, c, r):
		case x < 20 && n > ck.cfg.MaxLive/2:
			ck.remove(id)
			ck.delete(ctx, c, id)
		case x < 27:
			ck.op(ctx, "reset", id, 2*time.Minute, func(ctx context.Context) error {
				_, err := c.Reset(ctx, id)
				return err
			})
		case x < 31:
			ck.mu.Lock()
			ck.snapNo++
			name := fmt.Sprintf("chaos-%d", ck.snapNo)
			ck.mu.Unlock()
			ck.op(ctx, "snapshot", id, 2*time.Minute, func(ctx context.Context) error {
				_, err := c.Snapshot(ctx, id, name)
				return err
			})
		case x < 35 && n < ck.cfg.MaxLive:
			ck.op(ctx, "fork", id, 2*time.Minute, func(ctx context.Context) error {
				res, err := c.Fork(ctx, id, &api.ForkRequest{Count: 1})
				if err != nil {
					return err
				}
				for _, sb := range res.Sandboxes {
					ck.add(sb.ID)
				}
				return nil
			})
		case x < 50 && ck.trajStep(ctx, c, r):
		case x < 70:
			ck.exec(ctx, c, r, id, false)
		default:
			ck.exec(ctx, c, r, id, true)
		}
	}
}

// delete deletes a sandbox. The request counts from when it is sent: a
// delete cut short by a kill may have taken effect (the sandbox is gone,
// or failed), so it is retried until answered, never used again.
func (ck *chaosLoad) delete(ctx context.Context, c *client.Client, id string) {
	ck.l.deleted(id)
	ck.op(ctx, "delete", id, 2*time.Minute, func(ctx context.Context) error {
		err := c.DeleteSandbox(ctx, id)
		if err != nil && !client.IsNotFound(err) {
			ck.mu.Lock()
			ck.undeleted = append(ck.undeleted, id)
			ck.mu.Unlock()
		}
		return err
	})
}

// retryDelete retries, now and then, a delete that got no answer; it
// says whether it did.
func (ck *chaosLoad) retryDelete(ctx context.Context, c *client.Client, r *rand.Rand) bool {
	ck.mu.Lock()
	if len(ck.undeleted) == 0 || r.IntN(4) != 0 {
		ck.mu.Unlock()
		return false
	}
	id := ck.undeleted[0]
	ck.undeleted = ck.undeleted[1:]
	ck.mu.Unlock()
	ck.delete(ctx, c, id)
	return true
}

// exec runs a command whose output is known to the byte, buffered or
// streamed, and checks the answer.
func (ck *chaosLoad) exec(ctx context.Context, c *client.Client, r *rand.Rand, id string, stream bool) {
	lines := 1 + r.IntN(20000)
	salt := r.IntN(1 << 30)
	cmd := fmt.Sprintf("seq %d %d; echo done-%d", salt, salt+lines-1, salt)
	var want strings.Builder
	for i := salt; i < salt+lines; i++ {
		want.WriteString(strconv.Itoa(i))
		want.WriteByte('\n')
	}
	fmt.Fprintf(&want, "done-%d\n", salt)
	req := &api.ExecRequest{Shell: cmd, TimeoutMs: chaosExecTimeout.Milliseconds()}
	name := "exec"
	if stream {
		name = "exec stream"
	}
	ck.op(ctx, name, id, chaosExecTimeout+chaosGrace, func(ctx context.Context) error {
		var res *api.ExecResult
		var out strings.Builder
		var err error
		if stream {
			res, err = c.ExecStream(ctx, id, req, func(ev api.ExecEvent) error {
				if ev.Stdout != nil {
					out.WriteString(*ev.Stdout)
				}
				return nil
			})
		} else {
			res, err = c.Exec(ctx, id, req)
			if res != nil {
				out.WriteString(res.Stdout)
			}
		}
		if err != nil {
			return err
		}
		if v := execVerdict(want.String(), res, out.String()); v != "" {
			// Exit 137 and friends: the agent or the sandbox was killed
			// under the command. That is an answer that says so, not wrong
			// output; anything else is.
			if !strings.HasPrefix(v, "exit code") && v != "timed out" {
				ck.l.violate("%s in %s: %s", name, id, v)
				return nil
			}
			return &api.Error{Code: api.CodeUnavailable, Message: "command killed: " + v}
		}
		return nil
	})
}

// trajStep sends a trajectory's next step (or, after an error, the same
// step again; now and then an answered step again, which must replay),
// creating the trajectory's sandbox first if there are fewer than
// chaosMaxTrajs. It says whether it did anything (a trajectory busy with
// another loop's step is left alone).
func (ck *chaosLoad) trajStep(ctx context.Context, c *client.Client, r *rand.Rand) bool {
	ck.mu.Lock()
	n := len(ck.trajs)
	var t *chaosTraj
	if n > 0 {
		t = ck.trajs[r.IntN(n)]
	}
	ck.mu.Unlock()
	if n < chaosMaxTrajs && (t == nil || r.IntN(4) == 0) {
		ck.op(ctx, "trajectory create", "", 2*time.Minute, func(ctx context.Context) error {
			sb, err := c.CreateSandbox(ctx, ck.req)
			if err != nil {
				return err
			}
			ck.l.created(sb.ID)
			ck.mu.Lock()
			ck.trajs = append(ck.trajs, newChaosTraj("chaos-"+sb.ID, sb.ID))
			ck.mu.Unlock()
			return nil
		})
		return true
	}
	if t == nil || !t.mu.TryLock() {
		return false
	}
	defer t.mu.Unlock()
	step, retry, resent := t.next, t.pending, false
	if !t.pending && len(t.ok) > 0 && r.IntN(5) == 0 {
		step, resent = t.ok[r.IntN(len(t.ok))], true
	}
	if retry {
		ck.l.trajRetry()
	}
	req := &api.ExecRequest{Shell: trajCommand(step), TimeoutMs: chaosExecTimeout.Milliseconds(),
		Trajectory: &api.Trajectory{ID: t.id, Step: step}}
	ck.op(ctx, "trajectory step", t.sandbox, chaosExecTimeout+chaosGrace, func(ctx context.Context) error {
		if !resent {
			t.pending = true
		}
		res, err := c.Exec(ctx, t.sandbox, req)
		if err != nil {
			return err
		}
		if v := trajAnswerVerdict(res, resent); v != "" {
			ck.l.violate("trajectory %s step %d in %s: %s", t.id, step, t.sandbox, v)
		}
		ck.l.trajAnswered(retry, resent, res.Replayed)
		if !resent {
			if res.ExitCode == 0 {
				t.ok = append(t.ok, step)
			}
			t.next++
			t.pending = false
		}
		return nil
	})
	return true
}

// checkTrajs checks, at the end, each trajectory whose sandbox works: its
// file (every step's line at most once, a successful step's exactly once)
// and the server's log of it.
func (ck *chaosLoad) checkTrajs(ctx context.Context, c *client.Client, works map[string]bool) {
	ck.mu.Lock()
	trajs := append([]*chaosTraj(nil), ck.trajs...)
	ck.mu.Unlock()
	for _, t := range trajs {
		t.mu.Lock()
		sent, ok := t.sent(), append([]int64(nil), t.ok...)
		t.mu.Unlock()
		if !works[t.sandbox] || sent == 0 {
			continue // a sandbox that does not work is a violation already
		}
		octx, cancel := context.WithTimeout(ctx, chaosGrace)
		file, err := c.ReadFile(octx, t.sandbox, chaosTrajFile)
		if client.IsNotFound(err) && len(ok) == 0 {
			file, err = nil, nil
		}
		var tlog *api.TrajectoryLog
		if err == nil {
			tlog, err = c.GetTrajectory(octx, t.id)
		}
		cancel()
		if err != nil {
			ck.l.violate("trajectory %s in %s: read at the end: %v", t.id, t.sandbox, err)
			continue
		}
		bad := trajFileVerdict(string(file), sent, ok)
		more, replays := trajLogVerdict(tlog, t.sandbox, ok)
		for _, v := range append(bad, more...) {
			ck.l.violate("trajectory %s in %s: %s", t.id, t.sandbox, v)
		}
		ck.l.trajChecked(len(ok), replays)
	}
}

// kill picks a victim and kill -9s it: the server (restarted), the blobfs
// worker (its keeper restarts it) or a random sandbox's agent.
func (ck *chaosLoad) kill(ctx, runCtx context.Context, r *rand.Rand) (string, error) {
	switch x := r.IntN(100); {
	case x < 35:
		ck.srv.kill()
		// Stay down a random while, as a crash loop would; the restart
		// may outlast the run (ctx, not runCtx).
		select {
		case <-runCtx.Done():
		case <-time.After(time.Duration(r.IntN(3000)) * time.Millisecond):
		}
		return "server", ck.srv.ensureUp(ctx)
	case x < 65:
		pid, err := readPid(blobfs.WorkerPidPath(filepath.Join(ck.srv.data, "edge", "blobfs")))
		if err != nil {
			return "blobfs worker", nil // none yet: nothing to kill
		}
		if !strings.Contains(cmdline(pid), "blobfs") {
			return "blobfs worker", nil
		}
		return "blobfs worker", syscall.Kill(pid, syscall.SIGKILL)
	default:
		agents := ck.srv.agents()
		if len(agents) == 0 {
			return "agent", nil
		}
		return "agent", syscall.Kill(agents[r.IntN(len(agents))], syscall.SIGKILL)
	}
}

// chaosServer is the child `dsec server`.
type chaosServer struct {
	bin, data, parent string
	args              []string
	keep              bool

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	url  string
	key  string
}

var chaosReadyRE = regexp.MustCompile(`msg="dsec server ready" addr=(\S+)`)

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *chaosServer) start(ctx context.Context) error {
	logs, err := os.OpenFile(filepath.Join(s.data, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw, err := os.Pipe()
	if err != nil {
		logs.Close()
		return err
	}
	cmd.Stdout, cmd.Stderr = logs, pw
	if err := cmd.Start(); err != nil {
		logs.Close()
		pr.Close()
		pw.Close()
		return err
	}
	pw.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	addr := make(chan string, 1)
	go func() {
		defer logs.Close()
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			fmt.Fprintln(logs, sc.Text())
			if m := chaosReadyRE.FindStringSubmatch(sc.Text()); m != nil && !sent {
				addr <- m[1]
				sent = true
			}
		}
		if !sent {
			close(addr)
		}
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			return fmt.Errorf("dsec server exited before it was ready; see %s", filepath.Join(s.data, "server.log"))
		}
		key, err := os.ReadFile(filepath.Join(s.data, "admin.key"))
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.cmd, s.done, s.url, s.key = cmd, done, "http://"+a, strings.TrimSpace(string(key))
		s.mu.Unlock()
		return nil
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		<-done
		return errors.New("dsec server not ready after 2 minutes")
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		return ctx.Err()
	}
}

func (s *chaosServer) client() *client.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return client.New(s.url, s.key)
}

// kill kill -9s the server process (not its process group: blobfs and the
// sandboxes are not its children to kill).
func (s *chaosServer) kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// ensureUp starts the server again if it is not running.
func (s *chaosServer) ensureUp(ctx context.Context) error {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	select {
	case <-done:
		return s.start(ctx)
	default:
		return nil
	}
}

// agents are the pids of the sandboxes' agents: dsec-agent processes in a
// cgroup under the server's cgroup parent.
func (s *chaosServer) agents() []int {
	var out []int
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if strings.TrimSpace(string(comm)) != "dsec-agent" {
			continue
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if strings.Contains(string(cg), "/"+s.parent+"/") {
			out = append(out, pid)
		}
	}
	return out
}

// leaks lists what is left of sandboxes: their directories, mounts under
// the data dir (the node's blobfs mount aside), loop devices on its
// files, runc containers, cgroups and processes under the cgroup parent.
func (s *chaosServer) leaks() []string {
	var out []string
	for _, dir := range []string{filepath.Join(s.data, "edge", "container", "sandboxes"), filepath.Join(s.data, "edge", "microvm", "vms")} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			out = append(out, "directory "+filepath.Join(dir, e.Name()))
		}
	}
	blobfsMount := blobfs.MountDir(filepath.Join(s.data, "edge", "blobfs"))
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], s.data+"/") && f[4] != blobfsMount {
				out = append(out, "mount "+f[4])
			}
		}
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), s.data+"/") {
			out = append(out, "loop device "+filepath.Base(filepath.Dir(filepath.Dir(f)))+" on "+strings.TrimSpace(string(b)))
		}
	}
	runcRoot := filepath.Join(s.data, "edge", "container", "runc")
	if b, err := exec.Command("runc", "--root", runcRoot, "list", "-q").Output(); err == nil {
		for _, id := range strings.Fields(string(b)) {
			out = append(out, "container "+id)
		}
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/" + s.parent + "/*")
	more, _ := filepath.Glob("/sys/fs/cgroup/*/" + s.parent + "/*")
	for _, d := range append(cgs, more...) {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if strings.HasPrefix(filepath.Base(d), "spare-") && len(procs) == 0 {
				continue // an emptied memory cgroup the node keeps for its next containers
			}
			out = append(out, "cgroup "+d)
			for _, p := range strings.Fields(string(procs)) {
				out = append(out, "process "+p+" in "+d)
			}
		}
	}
	return out
}

// teardown stops the server and blobfs and removes what is left, the
// data directory included unless it is kept for a look.
func (s *chaosServer) teardown() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd != nil {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Signal(syscall.SIGKILL)
			<-done
		}
	}
	runcRoot := filepath.Join(s.data, "edge", "container", "runc")
	if b, err := exec.Command("runc", "--root", runcRoot, "list", "-q").Output(); err == nil {
		for _, id := range strings.Fields(string(b)) {
			exec.Command("runc", "--root", runcRoot, "delete", "--force", id).Run()
		}
	}
	bfs := filepath.Join(s.data, "edge", "blobfs")
	syscall.Unmount(blobfs.MountDir(bfs), syscall.MNT_DETACH)
	for _, p := range []string{filepath.Join(bfs, "blobfs.pid"), blobfs.WorkerPidPath(bfs)} {
		if pid, err := readPid(p); err == nil && strings.Contains(cmdline(pid), "blobfs") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		lines := strings.Split(string(b), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if f := strings.Fields(lines[i]); len(f) > 4 && strings.HasPrefix(f[4], s.data+"/") {
				syscall.Unmount(f[4], syscall.MNT_DETACH)
			}
		}
	}
	for _, root := range append([]string{"/sys/fs/cgroup"}, globDirs("/sys/fs/cgroup/*")...) {
		cg := filepath.Join(root, s.parent)
		entries, _ := os.ReadDir(cg)
		for _, e := range entries {
			syscall.Rmdir(filepath.Join(cg, e.Name()))
		}
		syscall.Rmdir(cg)
	}
	if !s.keep {
		os.RemoveAll(s.data)
	}
}

func globDirs(pattern string) []string {
	m, _ := filepath.Glob(pattern)
	return m
}

func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("%s: no pid", path)
	}
	return pid, nil
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return string(b)
}
