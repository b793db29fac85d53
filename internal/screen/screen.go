// Package screen checks the input actions of the screen API and turns
// them into steps for a display backend (QEMU's input-send-event, or X11
// XTEST in a container): pointer moves in absolute pixels, button and
// key presses by name, and waits. It owns the US keyboard layout that
// "type" uses and the key names that "key" accepts. It never touches a
// display itself.
package screen

import (
	"fmt"
	"strings"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Limits of one input request.
const (
	MaxActions   = 1000
	MaxTextLen   = 10000
	MaxWaitMS    = 10000
	MaxScroll    = 100
	maxTotalWait = 60 * time.Second
)

// Step kinds.
const (
	StepMove   = "move"   // X, Y
	StepButton = "button" // Button, Down
	StepKey    = "key"    // Key (a QEMU qcode name), Down
	StepWait   = "wait"   // Wait
)

// Step is one low-level input event.
type Step struct {
	Kind   string
	X, Y   int
	Button string // left, right, middle, wheel-up, wheel-down, wheel-left, wheel-right
	Key    string
	Down   bool
	Wait   time.Duration
}

// Compile checks actions against a display of size d and returns the
// steps that perform them. A bad action is errdefs.ErrInvalid naming it.
func Compile(actions []api.InputAction, d api.Display) ([]Step, error) {
	if len(actions) == 0 {
		return nil, errdefs.Invalid("input needs at least one action")
	}
	if len(actions) > MaxActions {
		return nil, errdefs.Invalid("at most %d input actions, not %d", MaxActions, len(actions))
	}
	var steps []Step
	var waited time.Duration
	for i, a := range actions {
		s, err := compile(a, d)
		if err != nil {
			return nil, errdefs.Invalid("actions[%d] (%s): %v", i, a.Type, err)
		}
		for _, st := range s {
			waited += st.Wait
		}
		steps = append(steps, s...)
	}
	if waited > maxTotalWait {
		return nil, errdefs.Invalid("the actions wait %s in all, over %s", waited, maxTotalWait)
	}
	return steps, nil
}

func compile(a api.InputAction, d api.Display) ([]Step, error) {
	switch a.Type {
	case api.InputMove:
		x, y, err := point(a.X, a.Y, d)
		if err != nil {
			return nil, err
		}
		return []Step{{Kind: StepMove, X: x, Y: y}}, nil
	case api.InputClick:
		x, y, err := point(a.X, a.Y, d)
		if err != nil {
			return nil, err
		}
		button := a.Button
		switch button {
		case "":
			button = "left"
		case "left", "right", "middle":
		default:
			return nil, fmt.Errorf("button %q: want left, right or middle", a.Button)
		}
		count := a.Count
		if count == 0 {
			count = 1
		}
		if count < 1 || count > 3 {
			return nil, fmt.Errorf("count %d: want 1, 2 or 3", a.Count)
		}
		steps := []Step{{Kind: StepMove, X: x, Y: y}}
		for range count {
			steps = append(steps, Step{Kind: StepButton, Button: button, Down: true},
				Step{Kind: StepButton, Button: button}, Step{Kind: StepWait, Wait: 30 * time.Millisecond})
		}
		return steps, nil
	case api.InputDrag:
		if len(a.From) != 2 || len(a.To) != 2 {
			return nil, fmt.Errorf("from and to must each be [x, y]")
		}
		x0, y0, err := point(&a.From[0], &a.From[1], d)
		if err != nil {
			return nil, fmt.Errorf("from: %v", err)
		}
		x1, y1, err := point(&a.To[0], &a.To[1], d)
		if err != nil {
			return nil, fmt.Errorf("to: %v", err)
		}
		steps := []Step{{Kind: StepMove, X: x0, Y: y0}, {Kind: StepButton, Button: "left", Down: true}}
		// A few moves on the way: some programs only see a drag that
		// moves while the button is held.
		const n = 8
		for i := 1; i <= n; i++ {
			steps = append(steps, Step{Kind: StepMove, X: x0 + (x1-x0)*i/n, Y: y0 + (y1-y0)*i/n},
				Step{Kind: StepWait, Wait: 10 * time.Millisecond})
		}
		return append(steps, Step{Kind: StepButton, Button: "left"}), nil
	case api.InputScroll:
		x, y, err := point(a.X, a.Y, d)
		if err != nil {
			return nil, err
		}
		if a.DX == 0 && a.DY == 0 {
			return nil, fmt.Errorf("dx or dy must be set")
		}
		if abs(a.DX) > MaxScroll || abs(a.DY) > MaxScroll {
			return nil, fmt.Errorf("dx and dy are at most %d steps", MaxScroll)
		}
		steps := []Step{{Kind: StepMove, X: x, Y: y}}
		wheel := func(n int, neg, pos string) {
			b := pos
			if n < 0 {
				b = neg
			}
			for range abs(n) {
				steps = append(steps, Step{Kind: StepButton, Button: b, Down: true}, Step{Kind: StepButton, Button: b})
			}
		}
		wheel(a.DY, "wheel-up", "wheel-down")
		wheel(a.DX, "wheel-left", "wheel-right")
		return steps, nil
	case api.InputType:
		if a.Text == "" {
			return nil, fmt.Errorf("text is empty")
		}
		if len(a.Text) > MaxTextLen {
			return nil, fmt.Errorf("text over %d bytes", MaxTextLen)
		}
		var steps []Step
		for _, r := range a.Text {
			key, shift, ok := keyOf(r)
			if !ok {
				return nil, fmt.Errorf("character %q cannot be typed (printable ASCII, newline and tab only; use a terminal's own input for the rest)", r)
			}
			steps = append(steps, press([]string{key}, shift)...)
		}
		return steps, nil
	case api.InputKey:
		keys, err := chord(a.Keys)
		if err != nil {
			return nil, err
		}
		return press(keys, false), nil
	case api.InputWait:
		if a.MS < 0 || a.MS > MaxWaitMS {
			return nil, fmt.Errorf("ms %d: want 0 to %d", a.MS, MaxWaitMS)
		}
		return []Step{{Kind: StepWait, Wait: time.Duration(a.MS) * time.Millisecond}}, nil
	case "":
		return nil, fmt.Errorf("type is required: one of move, click, drag, scroll, type, key, wait")
	}
	return nil, fmt.Errorf("unknown action type %q: want move, click, drag, scroll, type, key or wait", a.Type)
}

// press holds keys down in order and lets them go in reverse.
func press(keys []string, shift bool) []Step {
	if shift {
		keys = append([]string{"shift"}, keys...)
	}
	var steps []Step
	for _, k := range keys {
		steps = append(steps, Step{Kind: StepKey, Key: k, Down: true})
	}
	for i := len(keys) - 1; i >= 0; i-- {
		steps = append(steps, Step{Kind: StepKey, Key: keys[i]})
	}
	return steps
}

func point(x, y *int, d api.Display) (int, int, error) {
	if x == nil || y == nil {
		return 0, 0, fmt.Errorf("x and y are required")
	}
	if *x < 0 || *y < 0 || *x >= d.Width || *y >= d.Height {
		return 0, 0, fmt.Errorf("(%d, %d) is off the %dx%d screen", *x, *y, d.Width, d.Height)
	}
	return *x, *y, nil
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// chord parses "ctrl+alt+t" into key names (QEMU qcodes).
func chord(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("keys is empty: give a chord such as \"ctrl+c\" or \"Return\"")
	}
	var out []string
	for _, part := range strings.Split(s, "+") {
		name := strings.ToLower(strings.TrimSpace(part))
		if k, ok := keyNames[name]; ok {
			out = append(out, k)
			continue
		}
		if len(name) == 1 {
			if k, shift, ok := keyOf(rune(name[0])); ok && !shift && name != " " {
				out = append(out, k)
				continue
			}
		}
		if len(part) == 0 {
			return nil, fmt.Errorf("keys %q has an empty part", s)
		}
		return nil, fmt.Errorf("unknown key %q in %q", part, s)
	}
	return out, nil
}

// keyNames are the names "key" accepts besides single characters.
var keyNames = map[string]string{
	"ctrl": "ctrl", "control": "ctrl", "ctrl_l": "ctrl", "ctrl_r": "ctrl_r",
	"alt": "alt", "alt_l": "alt", "alt_r": "alt_r", "altgr": "alt_r",
	"shift": "shift", "shift_l": "shift", "shift_r": "shift_r",
	"super": "meta_l", "meta": "meta_l", "win": "meta_l", "cmd": "meta_l",
	"enter": "ret", "return": "ret", "tab": "tab", "space": "spc", "esc": "esc", "escape": "esc",
	"backspace": "backspace", "delete": "delete", "del": "delete", "insert": "insert",
	"home": "home", "end": "end", "pageup": "pgup", "page_up": "pgup", "pagedown": "pgdn", "page_down": "pgdn",
	"up": "up", "down": "down", "left": "left", "right": "right",
	"f1": "f1", "f2": "f2", "f3": "f3", "f4": "f4", "f5": "f5", "f6": "f6",
	"f7": "f7", "f8": "f8", "f9": "f9", "f10": "f10", "f11": "f11", "f12": "f12",
	"menu": "menu", "print": "print", "capslock": "caps_lock",
	"minus": "minus", "plus": "equal", "equal": "equal",
}

// keyOf is the US-layout key (a QEMU qcode) that types r, and whether
// shift is held for it.
func keyOf(r rune) (string, bool, bool) {
	switch {
	case r >= 'a' && r <= 'z':
		return string(r), false, true
	case r >= 'A' && r <= 'Z':
		return string(r - 'A' + 'a'), true, true
	case r >= '0' && r <= '9':
		return string(r), false, true
	}
	if k, ok := plainKeys[r]; ok {
		return k, false, true
	}
	if k, ok := shiftedKeys[r]; ok {
		return k, true, true
	}
	return "", false, false
}

var plainKeys = map[rune]string{
	' ': "spc", '\n': "ret", '\t': "tab", '-': "minus", '=': "equal", '[': "bracket_left", ']': "bracket_right",
	';': "semicolon", '\'': "apostrophe", '`': "grave_accent", '\\': "backslash", ',': "comma", '.': "dot", '/': "slash",
}

var shiftedKeys = map[rune]string{
	'!': "1", '@': "2", '#': "3", '$': "4", '%': "5", '^': "6", '&': "7", '*': "8", '(': "9", ')': "0",
	'_': "minus", '+': "equal", '{': "bracket_left", '}': "bracket_right", ':': "semicolon", '"': "apostrophe",
	'~': "grave_accent", '|': "backslash", '<': "comma", '>': "dot", '?': "slash",
}
