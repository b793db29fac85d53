package api

// Phase is a named policy phase of a sandbox: what its commands may reach
// while the phase is in force. A field left out takes the sandbox's own
// value (its top-level network; no file rules).
type Phase struct {
	Network *Network   `json:"network,omitempty"`
	Files   *FileRules `json:"files,omitempty"`
}

// FileRules restrict the file system for the commands of a phase.
type FileRules struct {
	// Deny: nothing beneath these absolute paths can be read, written,
	// executed or created.
	Deny []string `json:"deny,omitempty"`
	// ReadOnly: beneath these paths files can be read and executed and
	// directories listed, nothing else.
	ReadOnly []string `json:"read_only,omitempty"`
}

// SetPhaseRequest is the body of PUT /v1/sandboxes/{id}/phase.
type SetPhaseRequest struct {
	Phase string `json:"phase"`
}

// Profile is a named set of phases the server offers, so that a create
// request can say "profile": "swe" instead of spelling the phases out.
type Profile struct {
	Phases map[string]Phase `json:"phases"`
	// Phase is the phase a sandbox starts in.
	Phase string `json:"phase"`
}
