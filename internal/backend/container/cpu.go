package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/agent"
)

// cfsPeriod is the CFS bandwidth period, µs.
const cfsPeriod = 100000

// cpuShares is the cpu.shares of a sandbox that asked for cpu cores:
// cpu × 1024, but never below the kernel's default. The sandbox's cpu
// cgroup holds its agent, and on cgroup v1 the commands' quota is on a
// child of its own (limitCPU): the weight decides how the agent serving
// an exec fares against the node's other work, while the quota alone
// bounds what the tenant's commands take. At 51 (cpu 0.05) an agent lost
// to a blank's `runc run` at nice 10 (a weight of 110): an exec while the
// pool refilled took 41–64 ms p50 instead of 7–12 (docs/ARCHITECTURE.md,
// "CPU"). Above one core the weight grows with the request, as before.
func cpuShares(cpu float64) int64 {
	return max(int64(cpu*1024), defaultShares)
}

// cmdCgroup names the child of a sandbox's cgroup v1 cpu cgroup that its
// commands run in.
const cmdCgroup = "cmd"

// The commands' quota comes with a burst allowance of one quota
// (cpu.cfs_burst_us, Linux 5.14): what a period leaves unused is banked,
// up to one more quota, so a short command after a pause runs on twice
// the quota while the average stays at the quota. Each write of the
// cgroup's bandwidth adds a quota to what it holds (up to quota + burst),
// so a fresh commands' cgroup starts with both: at cpu 0.05 a sandbox's
// first command — a fork, an exec and an exit, 2–5 ms of CPU on this
// project's paravirtualized machines — no longer outruns its 5 ms and
// waits for the next period (55–90 ms).

// limitCPU applies the sandbox's CPU quota once the container has started:
// runc init (which compiles the seccomp filter) and the agent's start-up
// would otherwise crawl under a small quota. Shares are set by runc from
// the start.
//
// On cgroup v1 the quota goes on a child cpu cgroup that only the
// commands run in (the agent forks them from a thread placed there): the
// agent serving an exec is not charged to a quota of, say, 5% of a core,
// while every process of the tenant's is. Memory and pids limits stay on
// the sandbox's cgroups and cover the agent and the commands together. On
// cgroup v2, where the sandbox's cgroup id also keys its egress rules, the
// quota stays on the sandbox's cgroup (docs/ARCHITECTURE.md, "CPU").
func (b *Backend) limitCPU(ctx context.Context, rec *record) error {
	id, cpu := rec.Spec.ID, rec.Spec.Resources.CPU
	if cpu <= 0 {
		return nil
	}
	st, err := b.runc.readState(id)
	if err != nil {
		return err
	}
	quota := int64(cpu * cfsPeriod)
	if dir, ok := st.CgroupPaths["cpu"]; ok {
		err := b.placeCommands(ctx, id, dir, quota)
		if err == nil {
			return nil
		}
		b.log.WarnContext(ctx, "commands run in the agent's cpu cgroup: its quota throttles the agent too", "sandbox", id, "err", err)
		return os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(quota, 10)), 0)
	}
	if dir, ok := st.CgroupPaths[""]; ok {
		return os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(fmt.Sprintf("%d %d", quota, cfsPeriod)), 0)
	}
	return fmt.Errorf("no cpu cgroup for %s", id)
}

// placeCommands makes (or keeps) the commands' cpu cgroup under dir with
// the quota and hands its tasks file to the agent; then it lifts any quota
// from the agent's own cgroup (one a failed hand-off put there).
func (b *Backend) placeCommands(ctx context.Context, id, dir string, quota int64) error {
	tasks, err := commandsCgroup(dir, quota)
	if err != nil {
		return err
	}
	defer unix.Close(tasks)
	conn, err := b.Dial(ctx, id)
	if err != nil {
		return err
	}
	if err := agent.PlaceCommands(ctx, conn, tasks); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte("-1"), 0)
}

// commandsCgroup makes (or keeps) the commands' cpu cgroup under dir with
// the quota and opens its tasks file, for the agent to place its spawner
// there (write permission is the opener's).
func commandsCgroup(dir string, quota int64) (int, error) {
	cmd := filepath.Join(dir, cmdCgroup)
	if err := os.Mkdir(cmd, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return -1, err
	}
	for _, kv := range [][2]string{{"cpu.cfs_period_us", strconv.Itoa(cfsPeriod)}, {"cpu.cfs_quota_us", strconv.FormatInt(quota, 10)}} {
		if err := os.WriteFile(filepath.Join(cmd, kv[0]), []byte(kv[1]), 0); err != nil {
			return -1, fmt.Errorf("%s: %w", kv[0], err)
		}
	}
	if err := os.WriteFile(filepath.Join(cmd, "cpu.cfs_burst_us"), []byte(strconv.FormatInt(quota, 10)), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return -1, fmt.Errorf("cpu.cfs_burst_us: %w", err)
	}
	tasks, err := unix.Open(filepath.Join(cmd, "tasks"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open the commands' tasks file: %w", err)
	}
	return tasks, nil
}

// claimTasks prepares the commands' cpu cgroup of a sandbox being claimed
// and opens its tasks file, which goes to the agent with the new root
// (agent.ResetRoot): the claim then needs no placement round trip. -1
// when the commands share the agent's cgroup (no CPU request) or the
// quota is cgroup v2's (on the sandbox's cgroup, see limitCPU).
func claimTasks(st containerState, cpu float64) (int, error) {
	dir, ok := st.CgroupPaths["cpu"]
	if cpu <= 0 || !ok {
		return -1, nil
	}
	return commandsCgroup(dir, int64(cpu*cfsPeriod))
}
