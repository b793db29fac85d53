package agent

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestSpawnerNeverOnTheMainThread: a spawner confines its thread, and the
// main thread, the process's leader, must never be one — the kernel
// judges signals to the agent by the leader's credentials, so a confined
// leader takes its phase's commands' signals, and it is never ended. Each
// confined thread has no_new_privs set: the main thread must not, however
// many spawners came and went.
func TestSpawnerNeverOnTheMainThread(t *testing.T) {
	if llABI() == 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("no Landlock")
		}
		t.Skip("no Landlock")
	}
	status := "/proc/self/task/" + strconv.Itoa(os.Getpid()) + "/status"
	for i := range 200 {
		sp, err := newSpawner("/", FileRules{}, false, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		sp.stop()
		b, err := os.ReadFile(status)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "NoNewPrivs:\t1") {
			t.Fatalf("spawner %d confined the main thread", i)
		}
	}
}
