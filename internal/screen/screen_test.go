package screen

import (
	"bytes"
	"errors"
	"image/png"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

func TestPPMToPNG(t *testing.T) {
	ppm := append([]byte("P6\n# made by a test\n2 1\n255\n"), 255, 0, 0, 0, 0, 255)
	b, d, err := PPMToPNG(bytes.NewReader(ppm))
	if err != nil {
		t.Fatal(err)
	}
	if d != (api.Display{Width: 2, Height: 1}) {
		t.Fatalf("display %+v", d)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if r, _, _, _ := img.At(0, 0).RGBA(); r != 0xffff {
		t.Fatalf("pixel 0: red %x", r)
	}
	if _, _, bl, _ := img.At(1, 0).RGBA(); bl != 0xffff {
		t.Fatalf("pixel 1: blue %x", bl)
	}
	for _, bad := range []string{"P5\n1 1\n255\n\x00", "P6\n1 1\n65535\n\x00\x00\x00", "P6\n2 2\n255\n\x00"} {
		if _, _, err := PPMToPNG(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func ip(n int) *int { return &n }

func TestCompile(t *testing.T) {
	d := api.Display{Width: 800, Height: 600}
	steps, err := Compile([]api.InputAction{
		{Type: "click", X: ip(10), Y: ip(20), Count: 2},
		{Type: "type", Text: "A!"},
		{Type: "key", Keys: "ctrl+alt+t"},
		{Type: "scroll", X: ip(1), Y: ip(1), DY: -2},
		{Type: "drag", From: []int{0, 0}, To: []int{799, 599}},
		{Type: "wait", MS: 5},
	}, d)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, s := range steps {
		if s.Kind == StepKey && s.Down {
			keys = append(keys, s.Key)
		}
	}
	if got := strings.Join(keys, " "); got != "shift a shift 1 ctrl alt t" {
		t.Fatalf("keys pressed: %q", got)
	}
	if steps[0] != (Step{Kind: StepMove, X: 10, Y: 20}) {
		t.Fatalf("first step %+v", steps[0])
	}
	for _, tc := range []struct {
		a    api.InputAction
		want string
	}{
		{api.InputAction{Type: "jump"}, "unknown action type"},
		{api.InputAction{Type: "move", X: ip(800), Y: ip(0)}, "off the 800x600 screen"},
		{api.InputAction{Type: "move", X: ip(-1), Y: ip(0)}, "off the"},
		{api.InputAction{Type: "click", X: ip(1)}, "x and y are required"},
		{api.InputAction{Type: "click", X: ip(1), Y: ip(1), Button: "fourth"}, "button"},
		{api.InputAction{Type: "type", Text: "héllo"}, "cannot be typed"},
		{api.InputAction{Type: "key", Keys: "ctrl+hyper"}, "unknown key"},
		{api.InputAction{Type: "wait", MS: 20000}, "want 0 to"},
		{api.InputAction{Type: "drag", From: []int{1}}, "from and to"},
	} {
		_, err := Compile([]api.InputAction{tc.a}, d)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want invalid with %q", tc.a, err, tc.want)
		}
	}
	if _, err := Compile(nil, d); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("no actions: %v", err)
	}
}
