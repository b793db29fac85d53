// Package x11 is the screen of a sandbox that runs an X server (a
// container with the desktop toolkit): a screenshot of the root window
// (GetImage, encoded as PNG) and input through the XTEST extension, in
// pure Go over the X server's unix socket. The agent serves it; it never
// starts an X server itself.
package x11

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"
	"github.com/jezek/xgb/xtest"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/screen"
)

// SocketDir is where X servers put their unix sockets (X0, X1 ...).
const SocketDir = "/tmp/.X11-unix"

// ErrNoServer is returned by Find when no X server socket exists.
var ErrNoServer = errors.New("no X server runs in this sandbox (no socket in " + SocketDir + ")")

func init() {
	// xgb logs to stderr by default (a missing Xauthority, a closed
	// connection); the agent reports errors itself.
	xgb.Logger = log.New(io.Discard, "", 0)
}

// Find returns the display name (":0") of the lowest-numbered X server
// socket in dir.
func Find(dir string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", ErrNoServer
	}
	var nums []int
	for _, e := range ents {
		n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "X"))
		if err != nil || !strings.HasPrefix(e.Name(), "X") || e.Type()&os.ModeSocket == 0 {
			continue
		}
		nums = append(nums, n)
	}
	if len(nums) == 0 {
		return "", ErrNoServer
	}
	sort.Ints(nums)
	return ":" + strconv.Itoa(nums[0]), nil
}

// Display is a connection to an X server's first screen.
type Display struct {
	conn  *xgb.Conn
	setup *xproto.SetupInfo
	root  xproto.Window
	size  api.Display
	depth byte
}

// Open connects to the X server of name (":0"). Its socket path is
// resolved from SocketDir, so Open works wherever Find found it.
func Open(name string) (*Display, error) {
	num := strings.TrimPrefix(name, ":")
	if _, err := strconv.Atoi(num); err != nil {
		return nil, fmt.Errorf("display %q: want :N", name)
	}
	if _, err := os.Stat(filepath.Join(SocketDir, "X"+num)); err != nil {
		return nil, ErrNoServer
	}
	conn, err := xgb.NewConnDisplay(name)
	if err != nil {
		return nil, fmt.Errorf("connect to X display %s: %w", name, err)
	}
	setup := xproto.Setup(conn)
	if setup == nil || len(setup.Roots) == 0 {
		conn.Close()
		return nil, fmt.Errorf("display %s has no screen", name)
	}
	s := setup.DefaultScreen(conn)
	return &Display{
		conn: conn, setup: setup, root: s.Root, depth: s.RootDepth,
		size: api.Display{Width: int(s.WidthInPixels), Height: int(s.HeightInPixels)},
	}, nil
}

// Close drops the connection.
func (d *Display) Close() { d.conn.Close() }

// Size is the screen's size in pixels.
func (d *Display) Size() api.Display { return d.size }

// Screenshot returns the root window as PNG.
func (d *Display) Screenshot() ([]byte, error) {
	w, h := d.size.Width, d.size.Height
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	// Bands of rows keep each reply well under the server's request
	// size limits.
	const band = 128
	for y := 0; y < h; y += band {
		bh := min(band, h-y)
		r, err := xproto.GetImage(d.conn, xproto.ImageFormatZPixmap, xproto.Drawable(d.root),
			0, int16(y), uint16(w), uint16(bh), 0xffffffff).Reply()
		if err != nil {
			return nil, fmt.Errorf("x11 GetImage: %w", err)
		}
		if err := d.copyBand(img, r, y, bh); err != nil {
			return nil, err
		}
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	if err := enc.Encode(&buf, img); err != nil {
		return nil, fmt.Errorf("encode PNG: %w", err)
	}
	return buf.Bytes(), nil
}

// copyBand converts a ZPixmap band of 24- or 32-bit pixels (32 bits per
// pixel, the layout of every TrueColor X server in use) into img.
func (d *Display) copyBand(img *image.RGBA, r *xproto.GetImageReply, y0, rows int) error {
	if r.Depth != 24 && r.Depth != 32 {
		return fmt.Errorf("screen depth %d is not supported (24 or 32 only)", r.Depth)
	}
	w := d.size.Width
	if len(r.Data) < w*rows*4 {
		return fmt.Errorf("x11 GetImage: %d bytes for %dx%d pixels at 32 bpp", len(r.Data), w, rows)
	}
	msb := d.setup.ImageByteOrder == xproto.ImageOrderMSBFirst
	for y := range rows {
		src := r.Data[y*w*4 : (y+1)*w*4]
		dst := img.Pix[(y0+y)*img.Stride:]
		for x := range w {
			p := src[x*4 : x*4+4]
			b, g, rr := p[0], p[1], p[2]
			if msb {
				rr, g, b = p[1], p[2], p[3]
			}
			dst[x*4], dst[x*4+1], dst[x*4+2], dst[x*4+3] = rr, g, b, 0xff
		}
	}
	return nil
}

// buttons are the X pointer buttons of screen's button names.
var buttons = map[string]byte{
	"left": 1, "middle": 2, "right": 3,
	"wheel-up": 4, "wheel-down": 5, "wheel-left": 6, "wheel-right": 7,
}

// Do performs steps (screen.Compile's, for this screen's size) with XTEST.
func (d *Display) Do(ctx context.Context, steps []screen.Step) error {
	if err := xtest.Init(d.conn); err != nil {
		return fmt.Errorf("the X server has no XTEST extension: %w", err)
	}
	codes, err := d.keycodes()
	if err != nil {
		return err
	}
	fake := func(typ, detail byte, x, y int) error {
		if err := xtest.FakeInputChecked(d.conn, typ, detail, 0, d.root, int16(x), int16(y), 0).Check(); err != nil {
			return fmt.Errorf("x11 FakeInput: %w", err)
		}
		return nil
	}
	for _, st := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		switch st.Kind {
		case screen.StepMove:
			err = fake(xproto.MotionNotify, 0, st.X, st.Y)
		case screen.StepButton:
			b, ok := buttons[st.Button]
			if !ok {
				return fmt.Errorf("button %q has no X button", st.Button)
			}
			typ := byte(xproto.ButtonRelease)
			if st.Down {
				typ = xproto.ButtonPress
			}
			err = fake(typ, b, 0, 0)
		case screen.StepKey:
			sym, ok := keysyms[st.Key]
			if !ok && len(st.Key) == 1 {
				sym, ok = xproto.Keysym(st.Key[0]), true // a-z, 0-9: the keysym is the character
			}
			if !ok {
				return fmt.Errorf("key %q has no X keysym", st.Key)
			}
			code, ok := codes[sym]
			if !ok {
				return fmt.Errorf("key %q (keysym %#x) is not on the X server's keyboard map", st.Key, sym)
			}
			typ := byte(xproto.KeyRelease)
			if st.Down {
				typ = xproto.KeyPress
			}
			err = fake(typ, byte(code), 0, 0)
		case screen.StepWait:
			t := time.NewTimer(st.Wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		default:
			return fmt.Errorf("unknown input step %q", st.Kind)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// keycodes maps each keysym of the server's keyboard to the first
// keycode that produces it unshifted, or else shifted (shift comes as
// its own step, as on a real keyboard).
func (d *Display) keycodes() (map[xproto.Keysym]xproto.Keycode, error) {
	lo, hi := d.setup.MinKeycode, d.setup.MaxKeycode
	r, err := xproto.GetKeyboardMapping(d.conn, lo, byte(hi-lo+1)).Reply()
	if err != nil {
		return nil, fmt.Errorf("x11 GetKeyboardMapping: %w", err)
	}
	per := int(r.KeysymsPerKeycode)
	out := make(map[xproto.Keysym]xproto.Keycode)
	for col := 0; col < min(per, 2); col++ {
		for i := 0; i*per+col < len(r.Keysyms); i++ {
			sym := r.Keysyms[i*per+col]
			if _, ok := out[sym]; !ok && sym != 0 {
				out[sym] = xproto.Keycode(int(lo) + i)
			}
		}
	}
	return out, nil
}

// keysyms are the X keysyms of screen's key names (QEMU qcodes) other
// than the letters and digits.
var keysyms = map[string]xproto.Keysym{
	"spc": ' ', "minus": '-', "equal": '=', "bracket_left": '[', "bracket_right": ']',
	"semicolon": ';', "apostrophe": '\'', "grave_accent": '`', "backslash": '\\',
	"comma": ',', "dot": '.', "slash": '/',
	"ret": 0xff0d, "tab": 0xff09, "esc": 0xff1b, "backspace": 0xff08, "delete": 0xffff,
	"insert": 0xff63, "home": 0xff50, "end": 0xff57, "pgup": 0xff55, "pgdn": 0xff56,
	"left": 0xff51, "up": 0xff52, "right": 0xff53, "down": 0xff54,
	"shift": 0xffe1, "shift_r": 0xffe2, "ctrl": 0xffe3, "ctrl_r": 0xffe4,
	"alt": 0xffe9, "alt_r": 0xffea, "meta_l": 0xffeb, "caps_lock": 0xffe5,
	"menu": 0xff67, "print": 0xff61,
	"f1": 0xffbe, "f2": 0xffbf, "f3": 0xffc0, "f4": 0xffc1, "f5": 0xffc2, "f6": 0xffc3,
	"f7": 0xffc4, "f8": 0xffc5, "f9": 0xffc6, "f10": 0xffc7, "f11": 0xffc8, "f12": 0xffc9,
}
