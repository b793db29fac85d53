package edge

import (
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// ProtocolVersion is the version of the protocol between the control plane
// and its edges (the heartbeat, and the edge API the control plane calls
// back) this binary speaks. Builds that speak the same protocol version
// work together whatever their build versions; a change an older peer
// would misread must bump it, and the control plane then keeps accepting
// the versions it still speaks (MinProtocolVersion and up).
const ProtocolVersion = 1

// MinProtocolVersion is the oldest edge protocol a control plane of this
// build accepts.
const MinProtocolVersion = 1

// legacyProtocol is what a heartbeat without a protocol version speaks:
// edges built before versions were exchanged spoke version 1.
const legacyProtocol = 1

// CheckProtocol says whether a control plane of this build speaks the
// protocol of a node's heartbeat; a refusal is a failed precondition
// that names both sides' versions and what to do.
func CheckProtocol(hb Heartbeat) error {
	p := hb.Protocol
	if p == 0 {
		p = legacyProtocol
	}
	if p >= MinProtocolVersion && p <= ProtocolVersion {
		return nil
	}
	build := hb.Version
	if build == "" {
		build = "unknown"
	}
	advice := "upgrade the control plane to a build that speaks it"
	if p < MinProtocolVersion {
		advice = "upgrade the edge"
	}
	return fmt.Errorf("node %s speaks edge protocol %d (build %s); this control plane (build %s) speaks %d to %d: %s: %w",
		hb.ID, p, build, BuildVersion(), MinProtocolVersion, ProtocolVersion, advice, errdefs.ErrFailedPrecondition)
}

var buildVersion = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	v := bi.Main.Version
	if rev != "" && (v == "" || v == "(devel)") {
		v = rev[:min(12, len(rev))]
		if dirty {
			v += "-dirty"
		}
	}
	if v == "" {
		v = "unknown"
	}
	return v
})

// BuildVersion is this binary's build: its module version, or the commit
// it was built from (with -dirty for a modified tree).
func BuildVersion() string { return buildVersion() }
