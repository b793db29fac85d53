package api

// TTYSize is the window size of a pseudo-terminal, in characters.
type TTYSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// MaxTTYSize bounds the rows and columns of a pseudo-terminal.
const MaxTTYSize = 10000

// Types of the JSON text frames of a terminal WebSocket
// (GET /v1/sandboxes/{id}/terminal). Binary frames carry the terminal's
// bytes: keystrokes to the sandbox, output from it.
const (
	TerminalResize = "resize" // client → sandbox: rows, cols
	TerminalSignal = "signal" // client → sandbox: signal, to the foreground process group
	TerminalExit   = "exit"   // sandbox → client, last: exit_code (and signal)
)

// TerminalMessage is a JSON text frame of a terminal WebSocket.
type TerminalMessage struct {
	Type     string `json:"type"`
	Rows     int    `json:"rows,omitempty"`
	Cols     int    `json:"cols,omitempty"`
	Signal   string `json:"signal,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
}
