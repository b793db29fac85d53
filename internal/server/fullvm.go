package server

import (
	"context"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// layerFits checks that a layer of kind has the role slot (base,
// workspace, toolkit) in a sandbox of backend: a fullvm sandbox boots a
// single vm layer (a disk image) given as its base; no other backend
// takes a vm layer.
func layerFits(backend, slot, ref, kind string) error {
	if backend == api.BackendFullVM {
		if slot != api.KindBase {
			return errdefs.Invalid("a fullvm sandbox boots one vm layer, given as layers.base; it takes no %s layer", slot)
		}
		if kind != api.KindVM {
			return errdefs.Invalid("layer %s is a %s layer: a fullvm sandbox boots a vm layer (a disk image)", ref, kind)
		}
		return nil
	}
	if kind == api.KindVM {
		return errdefs.Invalid("layer %s is a vm layer (a disk image): only a fullvm sandbox boots it", ref)
	}
	if kind != slot {
		return errdefs.Invalid("layer %s is a %s layer, not a %s layer", ref, kind, slot)
	}
	return nil
}

// snapshotFits checks that a snapshot's stack suits the backend: a vm
// layer (a full VM's snapshot) starts fullvm sandboxes only, and a fullvm
// sandbox starts from nothing else.
func (s *Server) snapshotFits(ctx context.Context, tenant, backend string, stack []string) error {
	vm := false
	if len(stack) == 1 {
		l, err := s.store.LayerByDigest(ctx, tenant, stack[0])
		if err != nil {
			return err
		}
		vm = l.Kind == api.KindVM
	}
	switch {
	case vm && backend != api.BackendFullVM:
		return errdefs.Invalid("the snapshot is a vm layer (a full VM's disk): only a fullvm sandbox starts from it")
	case !vm && backend == api.BackendFullVM:
		return errdefs.Invalid("a fullvm sandbox starts from a vm layer; this snapshot is a layer of changes")
	}
	return nil
}

// fullVMCreateTimeout bounds a fullvm create: a whole distribution boots,
// under emulation (TCG) in tens of seconds to minutes.
const fullVMCreateTimeout = 11 * time.Minute

// createTimeoutFor is how long a create of a sandbox of backend may take.
func createTimeoutFor(backend string) time.Duration {
	if backend == api.BackendFullVM {
		return fullVMCreateTimeout
	}
	return createTimeout
}
