package api

// LabelFnCallPool marks a warm sandbox of a FnCall pool; its value names
// the pool. Such sandboxes appear in the tenant's list but take no direct
// calls: they serve POST /v1/fncall.
const LabelFnCallPool = "dsec.fncall.pool"

// FnCallRequest is the body of POST /v1/fncall: one short command run in a
// clean, pre-created sandbox of the layer stack. TimeoutMs bounds the whole
// call, the wait for a free sandbox included.
type FnCallRequest struct {
	Layers         *LayerRefs        `json:"layers"`
	Resources      Resources         `json:"resources,omitzero"`
	Cmd            []string          `json:"cmd,omitempty"`
	Shell          string            `json:"shell,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	Stdin          string            `json:"stdin,omitempty"`
	StdinEncoding  string            `json:"stdin_encoding,omitempty"`
	TimeoutMs      int64             `json:"timeout_ms,omitempty"`
	MaxOutputBytes int64             `json:"max_output_bytes,omitempty"`
}

// FnCallWarmRequest is the body of POST /v1/fncall/pools: make sure the
// pool of a layer stack holds at least Size sandboxes (within the server's
// maximum), ahead of a burst of calls.
type FnCallWarmRequest struct {
	Layers    *LayerRefs `json:"layers"`
	Resources Resources  `json:"resources,omitzero"`
	Size      int        `json:"size"`
}

// FnCallPool describes one warm pool of the tenant.
type FnCallPool struct {
	ID        string    `json:"id"` // the value of the dsec.fncall.pool label
	Layers    LayerRefs `json:"layers"`
	Resources Resources `json:"resources"`
	// Size counts every sandbox of the pool: Idle + Busy + Resetting +
	// Creating.
	Size      int   `json:"size"`
	Idle      int   `json:"idle"`
	Busy      int   `json:"busy"`
	Resetting int   `json:"resetting"`
	Creating  int   `json:"creating"`
	Waiting   int   `json:"waiting"` // calls waiting for a free sandbox
	Target    int   `json:"target"`  // the size demand asks for now
	Min       int   `json:"min"`
	Max       int   `json:"max"`
	Calls     int64 `json:"calls"` // calls served since the pool was made
	// Resets counts the calls after which the sandbox had to be reset;
	// after the others it was proven unchanged and handed on as it was.
	Resets int64 `json:"resets"`
}

// FnCallPoolList is the body of GET /v1/fncall/pools.
type FnCallPoolList struct {
	Pools []FnCallPool `json:"pools"`
}
