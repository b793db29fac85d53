package container_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/backendtest"
	"github.com/dsec-project/dsec/internal/backend/container"
	"github.com/dsec-project/dsec/internal/testutil"
)

func TestConformance(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"))
	agent := filepath.Join(testutil.Binaries(t), "dsec-agent")
	backendtest.Run(t, backendtest.Fixture{
		New: func(t *testing.T, root string) backend.Backend {
			// The test's temporary directory has a random name: unique among
			// the tests of everyone on the machine.
			parent := "dsec-test-" + filepath.Base(filepath.Dir(root))
			b, err := container.New(container.Config{Root: root, AgentPath: agent, CgroupParent: parent})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				b.Close()
				testutil.UnmountAll(root)
				dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
				for _, d := range append(dirs, "/sys/fs/cgroup/"+parent) {
					os.Remove(d)
				}
			})
			return b
		},
		Resources: api.Resources{CPU: 0.5, MemoryMB: 64, Pids: 128},
	})
}
