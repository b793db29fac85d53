package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
)

// cfsPeriod is the CFS bandwidth period, µs.
const cfsPeriod = 100000

// cpuShares is the cpu.shares of a sandbox that asked for cpu cores:
// cpu × 1024, but never below the kernel's default. The sandbox's cpu
// cgroup holds its agent, and on cgroup v1 the commands' quota is on a
// child of its own (limitCommands): the weight decides how the agent serving
// an exec fares against the node's other work, while the quota alone
// bounds what the tenant's commands take. At 51 (cpu 0.05) an agent lost
// to a blank's `runc run` at nice 10 (a weight of 110): an exec while the
// pool refilled took 41–64 ms p50 instead of 7–12 (docs/ARCHITECTURE.md,
// "CPU"). Above one core the weight grows with the request, as before.
func cpuShares(cpu float64) int64 {
	return max(int64(cpu*1024), defaultShares)
}

// cmdCgroup names the child of a sandbox's cgroup v1 cpu and pids cgroups
// that its commands run in.
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

// AgentPidsReserve is how many tasks (processes and threads) a sandbox's
// agent may have beyond its tenant's pids limit, on cgroup v1: the
// commands run in a child pids cgroup (cmdCgroup) that holds the tenant's
// limit, the sandbox's own has this much more. An agent (Go) needs a new
// thread now and then, and one that cannot make it aborts: with a shared
// limit, a fork bomb that used it all took the sandbox's agent with it.
// The agent has 5–9 threads; a reset's re-execution replaces them.
const AgentPidsReserve = 32

// limitCommands applies the limits the tenant's commands run under, once
// the container has started (runc init, which compiles the seccomp
// filter, and the agent's start-up would otherwise crawl under a small
// CPU quota; shares, memory and the pids limit runc sets from the start).
//
// On cgroup v1 the commands run in child cgroups of their own (cmdCgroup)
// that the agent forks them into, from a thread placed there: a cpu one
// with the quota, so that the agent serving an exec is not charged to a
// quota of, say, 5% of a core while every process of the tenant's is; a
// pids one with the tenant's limit, so that the agent keeps room for its
// threads (AgentPidsReserve). Memory stays on the sandbox's cgroup and
// covers the agent and the commands together. On cgroup v2, where the
// sandbox's cgroup id also keys its egress rules, the quota and the pids
// limit stay on the sandbox's cgroup (docs/ARCHITECTURE.md, "CPU").
func (b *Backend) limitCommands(ctx context.Context, rec *record) error {
	id, r := rec.Spec.ID, rec.Spec.Resources
	st, err := b.runc.readState(id)
	if err != nil {
		return err
	}
	if _, v1 := st.CgroupPaths["cpu"]; r.CPU > 0 && !v1 {
		dir, ok := st.CgroupPaths[""]
		if !ok {
			return fmt.Errorf("no cpu cgroup for %s", id)
		}
		quota := int64(r.CPU * cfsPeriod)
		if err := os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(fmt.Sprintf("%d %d", quota, cfsPeriod)), 0); err != nil {
			return err
		}
	}
	tasks, err := commandsCgroups(st, r)
	if err != nil || len(tasks) == 0 {
		return err
	}
	defer closeAll(tasks)
	err = b.placeCommands(ctx, id, tasks)
	if err != nil && len(tasks) > 1 {
		// An agent older than the pids cgroup takes the cpu one alone
		// (commandsCgroups puts it first).
		err = b.placeCommands(ctx, id, tasks[:1])
		if err == nil {
			b.log.InfoContext(ctx, "the agent is older than the commands' pids cgroup: they share its pids limit", "sandbox", id)
			if r.CPU > 0 {
				return commandsPlaced(st, api.Resources{CPU: r.CPU})
			}
			return nil
		}
	}
	if err != nil {
		b.log.WarnContext(ctx, "commands run in the agent's cgroups: its cpu quota throttles the agent too", "sandbox", id, "err", err)
		if dir, ok := st.CgroupPaths["cpu"]; ok && r.CPU > 0 {
			return os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(int64(r.CPU*cfsPeriod), 10)), 0)
		}
		return nil
	}
	return commandsPlaced(st, r)
}

// placeCommands hands the commands' cgroups' tasks files to the agent.
func (b *Backend) placeCommands(ctx context.Context, id string, tasks []int) error {
	conn, err := b.Dial(ctx, id)
	if err != nil {
		return err
	}
	return agent.PlaceCommands(ctx, conn, tasks...)
}

// commandsPlaced sets the sandbox's own cgroups once its agent forks the
// commands into theirs: no CPU quota on the agent (one a failed placement
// put there) and the pids limit with the agent's reserve.
func commandsPlaced(st containerState, r api.Resources) error {
	if dir, ok := st.CgroupPaths["cpu"]; ok && r.CPU > 0 {
		if err := writeBandwidth(filepath.Join(dir, "cpu.cfs_quota_us"), "-1"); err != nil {
			return err
		}
	}
	if dir, ok := st.CgroupPaths["pids"]; ok && r.Pids > 0 {
		if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.FormatInt(r.Pids+AgentPidsReserve, 10)), 0); err != nil {
			return fmt.Errorf("pids.max: %w", err)
		}
	}
	return nil
}

// commandsCgroups makes (or keeps) the commands' cgroup v1 cgroups of a
// sandbox that r asks for — cpu with the quota (first), pids with the
// limit — and opens their tasks files, for the agent to place its spawner
// there (write permission is the opener's). None on cgroup v2.
func commandsCgroups(st containerState, r api.Resources) (tasks []int, err error) {
	defer func() {
		if err != nil {
			closeAll(tasks)
			tasks = nil
		}
	}()
	if dir, ok := st.CgroupPaths["cpu"]; ok && r.CPU > 0 {
		quota := strconv.FormatInt(int64(r.CPU*cfsPeriod), 10)
		fd, err := commandsCgroup(dir, [][2]string{{"cpu.cfs_period_us", strconv.Itoa(cfsPeriod)}, {"cpu.cfs_quota_us", quota}, {"cpu.cfs_burst_us", quota}})
		if err != nil {
			return tasks, fmt.Errorf("commands' cpu cgroup: %w", err)
		}
		tasks = append(tasks, fd)
	}
	if dir, ok := st.CgroupPaths["pids"]; ok && r.Pids > 0 {
		fd, err := commandsCgroup(dir, [][2]string{{"pids.max", strconv.FormatInt(r.Pids, 10)}})
		if err != nil {
			return tasks, fmt.Errorf("commands' pids cgroup: %w", err)
		}
		tasks = append(tasks, fd)
	}
	return tasks, nil
}

// commandsCgroup makes (or keeps) the commands' child of the cgroup dir,
// writes settings to it and opens its tasks file. cpu.cfs_burst_us is
// skipped on a kernel without it (before 5.14).
func commandsCgroup(dir string, settings [][2]string) (int, error) {
	cmd := filepath.Join(dir, cmdCgroup)
	if err := os.Mkdir(cmd, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return -1, err
	}
	for _, kv := range settings {
		err := writeBandwidth(filepath.Join(cmd, kv[0]), kv[1])
		if err != nil && !(kv[0] == "cpu.cfs_burst_us" && errors.Is(err, os.ErrNotExist)) {
			return -1, fmt.Errorf("%s: %w", kv[0], err)
		}
	}
	tasks, err := unix.Open(filepath.Join(cmd, "tasks"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open the commands' tasks file: %w", err)
	}
	return tasks, nil
}

// writeBandwidth writes value to a CFS bandwidth file (cpu.cfs_period_us,
// cpu.cfs_quota_us, cpu.cfs_burst_us) unless it holds value already. Every
// write of one walks every CPU cgroup of the host to check the hierarchy's
// bandwidth, whatever it changes (tg_set_bandwidth): ~0.5 ms with 1,300
// sandboxes' cgroups, where reading is a few µs. A claim writes four, two
// of them (the commands' period, the agent's unlimited quota) unchanged.
func writeBandwidth(path, value string) error {
	if cur, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	return os.WriteFile(path, []byte(value), 0)
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
