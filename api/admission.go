package api

// DefaultAdmissionTimeout is how long, in seconds, a create waits in the
// admission queue when it sets no admission_timeout_seconds;
// MaxAdmissionTimeout is the most it may ask for.
const (
	DefaultAdmissionTimeout = 60
	MaxAdmissionTimeout     = 3600
)

// Admission is a control plane replica's admission queue: creates that
// fit on some node but wait because every such node is busy (its
// sandboxes keep max_cpu_load of its cores busy). They are placed as soon
// as load allows, tenants taking turns; memory, disk and quotas are never
// waited for.
type Admission struct {
	// Waiting creates now, from Tenants tenants; the longest has waited
	// OldestWaitMs.
	Waiting      int   `json:"waiting"`
	Tenants      int   `json:"tenants"`
	OldestWaitMs int64 `json:"oldest_wait_ms"`
	// Admitted, TimedOut and Left count, since the replica started, the
	// creates placed after waiting, those whose admission_timeout_seconds
	// ran out, and those that left otherwise (client gone, no room left).
	Admitted int64 `json:"admitted"`
	TimedOut int64 `json:"timed_out"`
	Left     int64 `json:"left"`
	// MaxCPULoad is the threshold: the fraction of a node's cores its
	// sandboxes may keep busy and the node still take new ones.
	MaxCPULoad float64 `json:"max_cpu_load"`
}
