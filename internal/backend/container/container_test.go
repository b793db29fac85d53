package container_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/backendtest"
	"github.com/dsec-project/dsec/internal/backend/container"
	"github.com/dsec-project/dsec/internal/testutil"
)

func TestConformance(t *testing.T) { conformance(t, container.PoolConfig{}) }

// TestConformancePool runs the suite again with the pool of blank
// sandboxes on: a create claims a blank one, and must give exactly what a
// cold create gives.
func TestConformancePool(t *testing.T) {
	conformance(t, container.PoolConfig{Max: 2, Min: 2})
}

func conformance(t *testing.T, pool container.PoolConfig) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"))
	agent := filepath.Join(testutil.Binaries(t), "dsec-agent")
	var claims atomic.Uint64
	backendtest.Run(t, backendtest.Fixture{
		New: func(t *testing.T, root string) backend.Backend {
			// The test's temporary directory has a random name: unique among
			// the tests of everyone on the machine.
			parent := "dsec-test-" + filepath.Base(filepath.Dir(root))
			b, err := container.New(container.Config{Root: root, AgentPath: agent, CgroupParent: parent, Pool: pool})
			if err != nil {
				t.Fatal(err)
			}
			// The suite abandons a backend to play an edge that died
			// ("recover after restart"); death releases the lock.
			container.PlayDead(b)
			t.Cleanup(func() {
				claims.Add(b.PoolStats().Claims)
				b.Close()
				os.Remove(container.LockPath(parent)) // PlayDead leaves it, as a death does
				testutil.UnmountAll(root)
				dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
				for _, d := range append(dirs, "/sys/fs/cgroup/"+parent) {
					os.Remove(d)
				}
			})
			// Creates claim from a warm pool, not from one still filling.
			testutil.Eventually(t, 30*time.Second, "the pool filled to the minimum", func() error {
				if st := b.PoolStats(); st.Size < pool.Min {
					return fmt.Errorf("want %d: %+v", pool.Min, st)
				}
				return nil
			})
			return b
		},
		Resources: api.Resources{CPU: 0.5, MemoryMB: 64, Pids: 128},
	})
	if pool.Max > 0 {
		// Every part of the suite that creates a sandbox claimed one.
		if n := claims.Load(); n < 8 {
			t.Errorf("only %d creates of the suite claimed a blank sandbox", n)
		}
		t.Logf("%d creates claimed a blank sandbox", claims.Load())
	}
}
