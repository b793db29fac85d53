package api

// LayerConfig is what a Dockerfile build keeps beside its layer: the
// image config. Sandboxes created from the layer get Env (under the
// create's own env) and Workdir as the default cwd of their execs.
type LayerConfig struct {
	Env        map[string]string `json:"env,omitempty"`
	Workdir    string            `json:"workdir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// BuildStep reports a step of a Dockerfile build: once when it starts,
// once when it is done (Done, with Cached and DurationMs).
type BuildStep struct {
	Index       int    `json:"index"` // 1-based, over every stage
	Total       int    `json:"total"`
	Stage       int    `json:"stage"`
	Line        int    `json:"line"`
	Instruction string `json:"instruction"`
	Cached      bool   `json:"cached,omitempty"`
	Done        bool   `json:"done,omitempty"`
	DurationMs  int64  `json:"duration_ms,omitempty"`
}

// BuildOutput is output of a RUN step.
type BuildOutput struct {
	Line   int    `json:"line"`
	Stream string `json:"stream"` // stdout or stderr
	Data   string `json:"data"`
}

// BuildResult is the end of a build that succeeded.
type BuildResult struct {
	Layer       Layer        `json:"layer"`
	Config      *LayerConfig `json:"config,omitempty"`
	Steps       int          `json:"steps"`
	CachedSteps int          `json:"cached_steps"`
	DurationMs  int64        `json:"duration_ms"`
}

// BuildError is the end of a build that failed: Line is the Dockerfile
// line (0 when the failure is not a step's), Output the tail of a failed
// RUN's output.
type BuildError struct {
	Code     string `json:"code"`
	Message  string `json:"message"`
	Line     int    `json:"line,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Output   string `json:"output,omitempty"`
}

// BuildEvent is one line of the NDJSON answer of POST /v1/layers:build.
// Exactly one field is set; the last event is Result or Error.
type BuildEvent struct {
	Step   *BuildStep   `json:"step,omitempty"`
	Output *BuildOutput `json:"output,omitempty"`
	Result *BuildResult `json:"result,omitempty"`
	Error  *BuildError  `json:"error,omitempty"`
}
