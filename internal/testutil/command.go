package testutil

import "testing"

// StartServerCommand starts the dsec binary with args given whole (say, the
// ExecStart of a systemd unit) on data, whose sandboxes' cgroups go under
// cgroupParent, and returns when it serves. Stop, Kill, Restart and the
// end-of-test cleanup work as for StartServer.
func StartServerCommand(t testing.TB, data, cgroupParent string, args []string) *Server {
	t.Helper()
	Require(t, ServerRequirements...)
	s := &Server{DataDir: data, t: t, CgroupParent: cgroupParent, args: args}
	s.start()
	t.Cleanup(s.cleanup)
	return s
}
