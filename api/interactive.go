package api

import "time"

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

// OutputEvent is one line of GET /v1/sandboxes/{id}/processes/{pid}/output
// with Accept: application/x-ndjson: a piece of one stream of a background
// process, or (last, once it has exited and both streams are read) its
// exit.
type OutputEvent struct {
	Stream string `json:"stream,omitempty"` // "stdout" or "stderr"
	// Offset is the absolute offset of Data's first byte in its stream;
	// Offset + len(Data) is where to resume from.
	Offset   int64   `json:"offset"`
	Data     *string `json:"data,omitempty"`
	Encoding string  `json:"encoding,omitempty"` // "base64" when Data is not UTF-8
	// Skipped counts bytes lost to the ring between the offset asked for
	// (or the previous event) and Offset.
	Skipped int64       `json:"skipped,omitempty"`
	Exit    *ExecResult `json:"exit,omitempty"`
}

// PortTokenCookie is the cookie a signed port URL sets, so that the pages
// it serves can load what they link to under the same port.
const PortTokenCookie = "dsec_port_token"

// PortURLRequest asks for a signed URL of a sandbox's port
// (POST /v1/sandboxes/{id}/ports/{port}/url).
type PortURLRequest struct {
	// TTLSeconds is how long the URL works: default 3600, at most 86400.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
	// Path is the path under the port the URL opens (default "/").
	Path string `json:"path,omitempty"`
}

// SignedURL is a signed URL of one WebSocket route of a sandbox
// (POST /v1/sandboxes/{id}/terminal/url, …/vnc/url): it opens without a
// key for a minute, so that a browser, which cannot set a WebSocket's
// headers, can open the terminal or the screen.
type SignedURL = PortURL

// PortURL is a signed URL of a sandbox's port: anyone holding it reaches
// that port of that sandbox, and nothing else, until it expires.
type PortURL struct {
	URL       string    `json:"url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}
