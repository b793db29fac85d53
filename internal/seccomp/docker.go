package seccomp

import (
	"fmt"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Docker is Docker's default profile (moby/profiles) for a process whose
// bounding set is caps, on the running kernel: what runc would be given.
func Docker(caps []string) (*specs.LinuxSeccomp, error) {
	s := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}, Linux: &specs.Linux{}}
	p, err := seccomp.GetDefaultProfile(s)
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	return p, nil
}
