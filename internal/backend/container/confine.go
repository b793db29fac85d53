package container

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/dsec-project/dsec/internal/seccomp"
)

// agentCaps is the agent's capability set: the commands' (defaultCaps)
// plus CAP_SYS_ADMIN over the sandbox's own namespaces, which it needs to
// reset the sandbox in place (new root, new IPC namespace). Every command
// is forked from a thread that dropped CAP_SYS_ADMIN from all its sets,
// bounding set included, so no command — nor anything it execs — has it.
var agentCaps = append(defaultCaps[:len(defaultCaps):len(defaultCaps)], "CAP_SYS_ADMIN")

// filters compiles, once per node, the two seccomp programs the agent
// loads: its own (Docker's profile for agentCaps, plus pivot_root) on
// all its threads before it serves anything, and the commands' (Docker's
// profile for defaultCaps: exactly what runc would load for them) on top,
// on the threads it forks commands from.
func filters() (agent, command []byte, err error) {
	cmdProf, err := seccomp.Docker(defaultCaps)
	if err != nil {
		return nil, nil, err
	}
	agentProf, err := seccomp.Docker(agentCaps)
	if err != nil {
		return nil, nil, err
	}
	agentProf.Syscalls = append(agentProf.Syscalls, specs.LinuxSyscall{Names: []string{"pivot_root"}, Action: specs.ActAllow})
	for _, p := range []struct {
		prof *specs.LinuxSeccomp
		out  *[]byte
	}{{agentProf, &agent}, {cmdProf, &command}} {
		prog, err := seccomp.Compile(p.prof)
		if err != nil {
			return nil, nil, fmt.Errorf("compile seccomp profile: %w", err)
		}
		if *p.out, err = prog.MarshalBinary(); err != nil {
			return nil, nil, err
		}
	}
	return agent, command, nil
}
