package api

// Display is the size of a sandbox's screen, in pixels.
type Display struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// Input action types.
const (
	InputMove   = "move"
	InputClick  = "click"
	InputDrag   = "drag"
	InputScroll = "scroll"
	InputType   = "type"
	InputKey    = "key"
	InputWait   = "wait"
)

// InputAction is one step of POST /v1/sandboxes/{id}/input.
type InputAction struct {
	Type string `json:"type"`
	// X and Y place the pointer (move, click, scroll).
	X *int `json:"x,omitempty"`
	Y *int `json:"y,omitempty"`
	// Button is left (the default), right or middle; Count 1 (the
	// default) or 2 (a double click).
	Button string `json:"button,omitempty"`
	Count  int    `json:"count,omitempty"`
	// From and To are [x, y] of a drag.
	From []int `json:"from,omitempty"`
	To   []int `json:"to,omitempty"`
	// DX and DY are scroll steps: DY > 0 scrolls down, DX > 0 right.
	DX int `json:"dx,omitempty"`
	DY int `json:"dy,omitempty"`
	// Text is typed (type): printable ASCII, newline and tab.
	Text string `json:"text,omitempty"`
	// Keys is a chord such as "ctrl+alt+t" or "Return" (key).
	Keys string `json:"keys,omitempty"`
	// MS is how long to wait (wait), at most 10000.
	MS int `json:"ms,omitempty"`
}

// InputRequest is the body of POST /v1/sandboxes/{id}/input.
type InputRequest struct {
	Actions []InputAction `json:"actions"`
}

// InputResult is the answer to POST /v1/sandboxes/{id}/input.
type InputResult struct {
	Done    int     `json:"done"`
	Display Display `json:"display"`
}
