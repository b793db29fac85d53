package client

import (
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/dsec-project/dsec/api"
)

// Screenshot returns a sandbox's screen as PNG (fullvm sandboxes).
func (c *Client) Screenshot(ctx context.Context, id string) ([]byte, error) {
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/screen", nil, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// Input performs input actions on a sandbox's screen, in order.
func (c *Client) Input(ctx context.Context, id string, actions ...api.InputAction) (*api.InputResult, error) {
	var res api.InputResult
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/input", nil,
		api.InputRequest{Actions: actions}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

func ptr(n int) *int { return &n }

// Click clicks button ("" for left) count times at (x, y).
func Click(x, y int, button string, count int) api.InputAction {
	return api.InputAction{Type: api.InputClick, X: ptr(x), Y: ptr(y), Button: button, Count: count}
}

// Move moves the pointer to (x, y).
func Move(x, y int) api.InputAction {
	return api.InputAction{Type: api.InputMove, X: ptr(x), Y: ptr(y)}
}

// Drag drags with the left button from (x0, y0) to (x1, y1).
func Drag(x0, y0, x1, y1 int) api.InputAction {
	return api.InputAction{Type: api.InputDrag, From: []int{x0, y0}, To: []int{x1, y1}}
}

// Scroll scrolls dy steps down (up if negative) and dx right at (x, y).
func Scroll(x, y, dx, dy int) api.InputAction {
	return api.InputAction{Type: api.InputScroll, X: ptr(x), Y: ptr(y), DX: dx, DY: dy}
}

// Type types text on a US keyboard.
func Type(text string) api.InputAction { return api.InputAction{Type: api.InputType, Text: text} }

// Key presses a chord such as "ctrl+c" or "Return".
func Key(keys string) api.InputAction { return api.InputAction{Type: api.InputKey, Keys: keys} }

// Wait waits ms milliseconds between actions.
func Wait(ms int) api.InputAction { return api.InputAction{Type: api.InputWait, MS: ms} }
