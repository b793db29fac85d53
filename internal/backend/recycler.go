package backend

import "context"

// Recycler is a Backend that can hand a sandbox on to its next user
// without a reset when nothing of it changed: the FnCall pools recycle a
// sandbox after every call, and most calls change nothing.
type Recycler interface {
	// Recycle resets the sandbox unless it proves that nothing of it
	// changed since its container last started (no process but its init,
	// the writable layer and every scratch mount as they were). It reports
	// whether it reset. What it cannot check counts as changed.
	Recycle(ctx context.Context, id string) (reset bool, err error)
}
