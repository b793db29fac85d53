package container_test

import (
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
			b, err := container.New(container.Config{
				Root: root, AgentPath: agent, CgroupParent: "dsec-test-" + filepath.Base(root),
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				b.Close()
				testutil.UnmountAll(root)
			})
			return b
		},
		Resources: api.Resources{CPU: 0.5, MemoryMB: 64, Pids: 128},
	})
}
