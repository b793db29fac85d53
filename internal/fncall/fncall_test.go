package fncall

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/testutil"
)

// fakeRuntime stands in for the control plane: the pool logic is tested
// here; real sandboxes are tested end to end in internal/e2e.
type fakeRuntime struct {
	mu         sync.Mutex
	n          int
	live       map[string]bool
	resets     map[string]int
	failReset  map[string]bool
	failAll    error
	createGate chan struct{} // if set, each create waits for a token
}

func newFake() *fakeRuntime {
	return &fakeRuntime{live: map[string]bool{}, resets: map[string]int{}, failReset: map[string]bool{}}
}

func (f *fakeRuntime) Create(ctx context.Context, tenant, pool string, spec any) (Sandbox, error) {
	if f.createGate != nil {
		select {
		case <-f.createGate:
		case <-ctx.Done():
			return Sandbox{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAll != nil {
		return Sandbox{}, f.failAll
	}
	f.n++
	id := fmt.Sprintf("sb-%d", f.n)
	f.live[id] = true
	return Sandbox{ID: id, Node: "n1"}, nil
}

func (f *fakeRuntime) Recycle(ctx context.Context, sb Sandbox) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resets[sb.ID]++
	if f.failReset[sb.ID] {
		return true, errors.New("reset failed")
	}
	return true, nil
}

func (f *fakeRuntime) Destroy(ctx context.Context, sb Sandbox) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, sb.ID)
	return nil
}

func (f *fakeRuntime) liveCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

type clock struct{ t atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.t.Load()) }
func (c *clock) advance(d time.Duration) { c.t.Add(int64(d)) }

func newManager(t *testing.T, cfg Config, rt Runtime) (*Manager, *clock) {
	m := New(cfg, rt)
	c := &clock{}
	c.t.Store(time.Now().UnixNano())
	m.now = c.now
	t.Cleanup(m.Wait)
	return m, c
}

var info = Info{Tenant: "t1"}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestCallsReuseResetSandboxes(t *testing.T) {
	rt := newFake()
	m, _ := newManager(t, Config{Max: 4}, rt)
	ctx := ctxFor(t, 10*time.Second)
	var first string
	for i := range 5 {
		l, err := m.Acquire(ctx, "k", info, nil, true)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = l.Sandbox().ID
		} else if l.Sandbox().ID != first {
			t.Fatalf("call %d got %s, want the one warm sandbox %s", i, l.Sandbox().ID, first)
		}
		m.Release(l, true)
		m.Wait() // the reset runs in the background
	}
	if rt.resets[first] != 5 || rt.n != 1 {
		t.Fatalf("resets %v, creates %d; want 5 resets of one sandbox", rt.resets, rt.n)
	}
	if ps := m.Pools("t1"); len(ps) != 1 || ps[0].Calls != 5 || ps[0].Resets != 5 || ps[0].Idle != 1 {
		t.Fatalf("pool stats %+v", ps)
	}
	if ps := m.Pools("other"); len(ps) != 0 {
		t.Fatalf("another tenant sees pools %+v", ps)
	}
}

func TestNoSandboxBeforeItsReset(t *testing.T) {
	rt := newFake()
	m, _ := newManager(t, Config{Max: 1}, rt)
	ctx := ctxFor(t, 10*time.Second)
	l, err := m.Acquire(ctx, "k", info, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lease)
	go func() {
		l2, err := m.Acquire(ctx, "k", info, nil, true)
		if err != nil {
			t.Error(err)
		}
		got <- l2
	}()
	testutil.EventuallyTrue(t, 10*time.Second, "the second call waiting", func() bool {
		ps := m.Pools("t1")
		return len(ps) == 1 && ps[0].Waiting == 1
	})
	select {
	case <-got:
		t.Fatal("a second call got a sandbox while the only one was busy")
	default:
	}
	m.Release(l, true)
	l2 := <-got
	rt.mu.Lock()
	resets := rt.resets[l2.Sandbox().ID]
	rt.mu.Unlock()
	if l2.Sandbox().ID != l.Sandbox().ID || resets != 1 {
		t.Fatalf("waiter got %s after %d resets; want %s after its reset", l2.Sandbox().ID, resets, l.Sandbox().ID)
	}
	m.Release(l2, true)
}

func TestGrowsWithDemandUpToMax(t *testing.T) {
	for _, tc := range []struct {
		name      string
		max, conc int
		want      int
	}{
		{"below max", 10, 6, 6},
		{"capped by max", 3, 6, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newFake()
			m, _ := newManager(t, Config{Max: tc.max}, rt)
			ctx := ctxFor(t, 10*time.Second)
			var wg sync.WaitGroup
			var peak, cur atomic.Int32
			release := make(chan struct{})
			for range tc.conc {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l, err := m.Acquire(ctx, "k", info, nil, true)
					if err != nil {
						t.Error(err)
						return
					}
					n := cur.Add(1)
					for {
						p := peak.Load()
						if n <= p || peak.CompareAndSwap(p, n) {
							break
						}
					}
					<-release
					cur.Add(-1)
					m.Release(l, true)
				}()
			}
			_ = testutil.Poll(5*time.Second, func() error {
				if n := int(peak.Load()); n < tc.want {
					return fmt.Errorf("%d at once", n)
				}
				return nil
			})
			close(release)
			wg.Wait()
			m.Wait()
			if int(peak.Load()) != tc.want || rt.n != tc.want {
				t.Fatalf("%d at once on %d sandboxes; want %d", peak.Load(), rt.n, tc.want)
			}
		})
	}
}

func TestWaitEndsAtDeadline(t *testing.T) {
	rt := newFake()
	rt.createGate = make(chan struct{}) // creates never finish
	m, _ := newManager(t, Config{Max: 2}, rt)
	_, err := m.Acquire(ctxFor(t, 50*time.Millisecond), "k", info, nil, true)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire on a pool that never gets a sandbox: %v", err)
	}
	close(rt.createGate) // the late sandbox goes idle, not lost
	m.Wait()
	if ps := m.Pools("t1"); ps[0].Waiting != 0 || ps[0].Idle != 1 || ps[0].Busy != 0 {
		t.Fatalf("after a timed-out wait: %+v", ps[0])
	}
	// The tenant's slot was given back.
	l, err := m.Acquire(ctxFor(t, time.Second), "k", info, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	m.Release(l, true)
}

func TestTenantConcurrency(t *testing.T) {
	rt := newFake()
	m, _ := newManager(t, Config{Max: 10, TenantConcurrency: 2}, rt)
	ctx := ctxFor(t, 5*time.Second)
	a, _ := m.Acquire(ctx, "k", info, nil, true)
	b, _ := m.Acquire(ctx, "k2", info, nil, true) // slots are per tenant, across pools
	if _, err := m.Acquire(ctxFor(t, 30*time.Millisecond), "k", info, nil, true); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("third call of a tenant limited to 2: %v", err)
	}
	other, err := m.Acquire(ctx, "k3", Info{Tenant: "t2"}, nil, true)
	if err != nil {
		t.Fatalf("another tenant is not limited by t1's calls: %v", err)
	}
	// A handover to a create takes no call slot.
	h, err := m.Acquire(ctx, "k", info, nil, false)
	if err != nil {
		t.Fatalf("handover while the tenant's calls are all busy: %v", err)
	}
	m.Detach(h)
	m.Release(a, true)
	c, err := m.Acquire(ctx, "k", info, nil, true)
	if err != nil {
		t.Fatalf("call after a slot was freed: %v", err)
	}
	for _, l := range []*Lease{b, c, other} {
		m.Release(l, true)
	}
}

func TestIdlePoolsShrinkToZero(t *testing.T) {
	rt := newFake()
	m, clk := newManager(t, Config{Max: 8, Window: 10 * time.Second, IdleTimeout: 20 * time.Second}, rt)
	ctx := ctxFor(t, 5*time.Second)
	var leases []*Lease
	for range 4 {
		l, err := m.Acquire(ctx, "k", info, nil, true)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	for _, l := range leases {
		m.Release(l, true)
	}
	m.Wait()
	m.resize()
	if ps := m.Pools("t1"); ps[0].Size != 4 || ps[0].Target != 4 {
		t.Fatalf("right after the burst: %+v", ps[0])
	}
	clk.advance(11 * time.Second) // demand forgotten, sandboxes not idle long enough
	m.resize()
	if ps := m.Pools("t1"); ps[0].Size != 4 || ps[0].Target != 0 {
		t.Fatalf("before the idle timeout: %+v", ps[0])
	}
	clk.advance(10 * time.Second)
	m.resize()
	m.Wait()
	if ps := m.Pools("t1"); len(ps) != 0 || rt.liveCount() != 0 {
		t.Fatalf("after the idle timeout: pools %+v, %d sandboxes alive", ps, rt.liveCount())
	}
}

func TestMinKeepsWarm(t *testing.T) {
	rt := newFake()
	m, clk := newManager(t, Config{Min: 2, Max: 8, Window: time.Second, IdleTimeout: time.Second}, rt)
	l, _ := m.Acquire(ctxFor(t, 5*time.Second), "k", info, nil, true)
	m.Release(l, true)
	m.resize()
	m.Wait()
	clk.advance(time.Hour - time.Minute)
	m.resize()
	m.Wait()
	if ps := m.Pools("t1"); len(ps) != 1 || ps[0].Size != 2 || rt.liveCount() != 2 {
		t.Fatalf("pool with min 2 after an idle hour: %+v, %d alive", ps, rt.liveCount())
	}
}

func TestResetFailureReplacesSandbox(t *testing.T) {
	rt := newFake()
	m, _ := newManager(t, Config{Max: 2}, rt)
	ctx := ctxFor(t, 5*time.Second)
	l, _ := m.Acquire(ctx, "k", info, nil, true)
	bad := l.Sandbox().ID
	rt.mu.Lock()
	rt.failReset[bad] = true
	rt.mu.Unlock()
	m.Release(l, true)
	m.Wait()
	l2, err := m.Acquire(ctx, "k", info, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Sandbox().ID == bad || rt.liveCount() != 1 {
		t.Fatalf("got %s after %s failed its reset (%d alive)", l2.Sandbox().ID, bad, rt.liveCount())
	}
	m.Release(l2, false) // a misbehaving sandbox is destroyed, not reset
	m.Wait()
	if rt.liveCount() != 0 {
		t.Fatalf("%d alive after releasing a dirty sandbox", rt.liveCount())
	}
}

func TestCreateFailureReachesWaiters(t *testing.T) {
	rt := newFake()
	rt.failAll = errors.New("no room")
	m, _ := newManager(t, Config{Max: 2}, rt)
	_, err := m.Acquire(ctxFor(t, 5*time.Second), "k", info, nil, true)
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire when creates fail: %v; want the create's error at once", err)
	}
}

func TestDetachAndForget(t *testing.T) {
	rt := newFake()
	m, _ := newManager(t, Config{Max: 4}, rt)
	ctx := ctxFor(t, 5*time.Second)
	l, _ := m.Acquire(ctx, "k", info, nil, false)
	sb := m.Detach(l)
	l2, _ := m.Acquire(ctx, "k", info, nil, true)
	if l2.Sandbox().ID == sb.ID {
		t.Fatal("a detached sandbox was leased again")
	}
	m.Release(l2, true)
	m.Wait()
	if !m.Forget(l2.Sandbox().ID) || m.Forget("sb-unknown") {
		t.Fatal("Forget does not tell pool sandboxes from others")
	}
	if ps := m.Pools("t1"); ps[0].Size != 0 {
		t.Fatalf("after forgetting the only idle sandbox: %+v", ps[0])
	}
}

// TestCloseDestroysEverySandbox: Close destroys the idle sandboxes at once,
// a leased one when its call hands it back, one being made when it is
// made; waiting and later calls fail as unavailable.
func TestCloseDestroysEverySandbox(t *testing.T) {
	rt := newFake()
	m, _ := newManager(t, Config{Max: 4}, rt)
	ctx := ctxFor(t, 10*time.Second)
	idle, err := m.Acquire(ctx, "idle", info, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	m.Release(idle, true)
	m.Wait()
	leased, err := m.Acquire(ctx, "leased", info, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	// A call waits for a sandbox still being made.
	rt.createGate = make(chan struct{})
	waited := make(chan error, 1)
	go func() {
		_, err := m.Acquire(ctx, "slow", info, nil, true)
		waited <- err
	}()
	testutil.EventuallyTrue(t, 5*time.Second, "the slow pool creating", func() bool {
		ps := m.Pools("t1")
		for _, p := range ps {
			if p.Creating == 1 {
				return true
			}
		}
		return false
	})

	closed := make(chan error, 1)
	go func() { closed <- m.Close(ctx) }()
	if err := <-waited; !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a waiting call got %v, want unavailable", err)
	}
	testutil.EventuallyTrue(t, 5*time.Second, "the idle sandbox destroyed", func() bool { return rt.liveCount() == 1 })
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a sandbox leased and one being made", err)
	default:
	}
	m.Release(leased, true)
	rt.createGate <- struct{}{}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if n := rt.liveCount(); n != 0 {
		t.Fatalf("%d sandboxes left after Close", n)
	}
	if _, err := m.Acquire(ctx, "idle", info, nil, true); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a call after Close got %v, want unavailable", err)
	}
	if rt.resets["sb-2"] != 0 {
		t.Errorf("the leased sandbox was reset (%d) before its destroy", rt.resets["sb-2"])
	}
}

// TestCloseGivesUpAtItsDeadline: a sandbox still leased when Close's
// context ends is reported, not waited for.
func TestCloseGivesUpAtItsDeadline(t *testing.T) {
	rt := newFake()
	m, _ := newManager(t, Config{Max: 4}, rt)
	leased, err := m.Acquire(ctxFor(t, 10*time.Second), "k", info, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(ctxFor(t, 50*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a sandbox leased: %v, want its deadline", err)
	}
	m.Release(leased, true)
	m.Wait()
	if n := rt.liveCount(); n != 0 {
		t.Fatalf("the sandbox released after Close gave up: %d left, want it destroyed", n)
	}
}
