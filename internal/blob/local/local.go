// Package local is the default blob.Store: a directory on this node's own
// disk, owned by this node alone (the all-in-one server's store). It is the
// posix store with exclusive ownership, which lets it sweep every stale
// temporary file after a crash. It must never be pointed at a directory
// other nodes write to: use package posix for that.
package local

import "github.com/dsec-project/dsec/internal/blob/posix"

// Open opens (creating it if need be) the store in dir.
func Open(dir string) (*posix.Store, error) {
	return posix.Open(dir, posix.Options{Exclusive: true})
}
