package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/testutil"
)

// rfbClient is the client side of RFB 3.8 (RFC 6143) with security type
// None, 32-bit true colour and Raw encoding: enough to read a screen and
// send keys and pointer events.
type rfbClient struct {
	c      net.Conn
	width  int
	height int
	fb     []byte // width*height pixels, 4 bytes each (B, G, R, unused)
}

// rfbHandshake speaks RFB's opening on c: version 3.8, security None, a
// shared session; then asks for 32-bit pixels in Raw encoding.
func rfbHandshake(t *testing.T, c net.Conn) *rfbClient {
	t.Helper()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	read := func(n int) []byte {
		t.Helper()
		b := make([]byte, n)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("rfb: read %d bytes: %v", n, err)
		}
		return b
	}
	write := func(b []byte) {
		t.Helper()
		if _, err := c.Write(b); err != nil {
			t.Fatalf("rfb: write: %v", err)
		}
	}
	if v := string(read(12)); v != "RFB 003.008\n" {
		t.Fatalf("rfb: server version %q, want 3.8", v)
	}
	write([]byte("RFB 003.008\n"))
	types := read(int(read(1)[0]))
	if !bytes.Contains(types, []byte{1}) {
		t.Fatalf("rfb: security types %v offer no None (1)", types)
	}
	write([]byte{1})
	if r := binary.BigEndian.Uint32(read(4)); r != 0 {
		t.Fatalf("rfb: security result %d", r)
	}
	write([]byte{1}) // ClientInit: shared
	init := read(24)
	rc := &rfbClient{c: c, width: int(binary.BigEndian.Uint16(init[0:])), height: int(binary.BigEndian.Uint16(init[2:]))}
	read(int(binary.BigEndian.Uint32(init[20:]))) // the desktop's name
	rc.fb = make([]byte, rc.width*rc.height*4)
	// SetPixelFormat: 32 bits per pixel, depth 24, little endian, true
	// colour, 8 bits a channel at shifts 16, 8, 0.
	write([]byte{0, 0, 0, 0, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0})
	write([]byte{2, 0, 0, 1, 0, 0, 0, 0}) // SetEncodings: Raw
	return rc
}

// frame asks for an update of the whole screen and applies what comes
// until the screen is covered (a full request) or one update came (an
// incremental one).
func (rc *rfbClient) frame(t *testing.T, incremental bool) {
	t.Helper()
	rc.c.SetDeadline(time.Now().Add(20 * time.Second))
	req := []byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if incremental {
		req[1] = 1
	}
	binary.BigEndian.PutUint16(req[6:], uint16(rc.width))
	binary.BigEndian.PutUint16(req[8:], uint16(rc.height))
	if _, err := rc.c.Write(req); err != nil {
		t.Fatalf("rfb: update request: %v", err)
	}
	read := func(n int) []byte {
		t.Helper()
		b := make([]byte, n)
		if _, err := io.ReadFull(rc.c, b); err != nil {
			t.Fatalf("rfb: read %d bytes: %v", n, err)
		}
		return b
	}
	for area := 0; area < rc.width*rc.height; {
		switch typ := read(1)[0]; typ {
		case 0: // FramebufferUpdate
			n := int(binary.BigEndian.Uint16(read(3)[1:]))
			for range n {
				h := read(12)
				x, y := int(binary.BigEndian.Uint16(h[0:])), int(binary.BigEndian.Uint16(h[2:]))
				w, ht := int(binary.BigEndian.Uint16(h[4:])), int(binary.BigEndian.Uint16(h[6:]))
				if enc := int32(binary.BigEndian.Uint32(h[8:])); enc != 0 {
					t.Fatalf("rfb: rectangle in encoding %d, asked Raw only", enc)
				}
				if x+w > rc.width || y+ht > rc.height {
					t.Fatalf("rfb: rectangle %dx%d+%d+%d off the %dx%d screen", w, ht, x, y, rc.width, rc.height)
				}
				px := read(w * ht * 4)
				for row := range ht {
					copy(rc.fb[((y+row)*rc.width+x)*4:], px[row*w*4:(row+1)*w*4])
				}
				area += w * ht
			}
			if incremental {
				return
			}
		case 1: // SetColourMapEntries
			read(int(binary.BigEndian.Uint16(read(5)[3:])) * 6)
		case 2: // Bell
		case 3: // ServerCutText
			read(int(binary.BigEndian.Uint32(read(7)[3:])))
		default:
			t.Fatalf("rfb: unknown server message %d", typ)
		}
	}
}

// colours counts the distinct colours of the framebuffer, up to 3.
func (rc *rfbClient) colours() int {
	seen := map[uint32]bool{}
	for i := 0; i+4 <= len(rc.fb); i += 4 * 3 {
		if seen[binary.LittleEndian.Uint32(rc.fb[i:])&0xffffff] = true; len(seen) >= 3 {
			return 3
		}
	}
	return len(seen)
}

// pointer sends a PointerEvent: buttons is the mask of pressed buttons.
func (rc *rfbClient) pointer(t *testing.T, x, y int, buttons byte) {
	t.Helper()
	m := []byte{5, buttons, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(m[2:], uint16(x))
	binary.BigEndian.PutUint16(m[4:], uint16(y))
	if _, err := rc.c.Write(m); err != nil {
		t.Fatalf("rfb: pointer event: %v", err)
	}
}

// typeText sends a KeyEvent press and release for each character
// (printable ASCII are their own keysyms; newline is Return).
func (rc *rfbClient) typeText(t *testing.T, s string) {
	t.Helper()
	for _, r := range s {
		sym := uint32(r)
		if r == '\n' {
			sym = 0xff0d
		}
		for _, down := range []byte{1, 0} {
			m := []byte{4, down, 0, 0, 0, 0, 0, 0}
			binary.BigEndian.PutUint32(m[4:], sym)
			if _, err := rc.c.Write(m); err != nil {
				t.Fatalf("rfb: key event: %v", err)
			}
		}
	}
}

// A container with the desktop toolkit has a VNC WebSocket: RFB through
// the edge and the agent to the toolkit's x11vnc. A client reads the
// screen (the terminal, at the display's size), clicks and types into the
// terminal — the command runs in the sandbox — and sees the screen
// change; a second client shares the screen through a signed URL, a third
// through dsec sandbox vnc's local port; after a reset VNC comes back.
// With x11vnc gone, or without an X server, the route is 400 saying why.
func TestDesktopContainerVNC(t *testing.T) {
	testutil.Require(t, testutil.Tool("Xvfb"), testutil.Tool("xterm"), testutil.Tool("x11vnc"),
		testutil.Tool("python3"), testutil.Tool("dpkg-query"))
	t0 := time.Now()
	step := func(what string) { t.Logf("%s: %s", time.Since(t0).Round(time.Millisecond), what) }
	s := startServer(t)
	step("server up")
	c := s.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	buildDesktopToolkit(ctx, t, s)
	sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{
		Layers:    &api.LayerRefs{Base: "base:minimal", Toolkit: desktopToolkit},
		Resources: api.Resources{MemoryMB: 256},
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	step("created")
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID); step("deleted") })
	t.Cleanup(func() { // before the delete
		if t.Failed() {
			dumpProcesses(t, c, sb.ID)
		}
	})
	poll(t, 30*time.Second, "the terminal on the screen", func() bool {
		b, err := c.Screenshot(ctx, sb.ID)
		if err != nil && !isInvalid(err) {
			t.Fatalf("screenshot: %v", err)
		}
		return err == nil && pngColours(t, b) >= 2
	})

	step("screen up")
	conn, err := c.DialVNC(ctx, sb.ID)
	if err != nil {
		t.Fatalf("vnc: %v", err)
	}
	defer conn.Close()
	rc := rfbHandshake(t, conn)
	if rc.width != 1024 || rc.height != 768 {
		t.Fatalf("vnc screen %dx%d, want the display's 1024x768", rc.width, rc.height)
	}
	rc.frame(t, false)
	if n := rc.colours(); n < 2 {
		t.Fatalf("the VNC screen is blank (%d colour)", n)
	}
	before := bytes.Clone(rc.fb)

	// Take over: click the terminal, type a command into it.
	rc.pointer(t, 200, 200, 0)
	rc.pointer(t, 200, 200, 1)
	rc.pointer(t, 200, 200, 0)
	rc.typeText(t, "echo vnc > /tmp/v\n")
	poll(t, 15*time.Second, "the command typed over VNC to run", func() bool {
		r, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"cat", "/tmp/v"}})
		return err == nil && r.ExitCode == 0 && r.Stdout == "vnc\n"
	})
	poll(t, 15*time.Second, "the VNC screen to change", func() bool {
		rc.frame(t, false)
		return !bytes.Equal(rc.fb, before)
	})

	step("typed over VNC, screen changed")
	// A second viewer shares the screen: a signed URL opens without a key.
	u, err := c.VNCURL(ctx, sb.ID)
	if err != nil {
		t.Fatalf("vnc url: %v", err)
	}
	ws, _, err := websocket.Dial(ctx, u.URL, &websocket.DialOptions{Subprotocols: []string{"binary"}})
	if err != nil {
		t.Fatalf("vnc by signed url: %v", err)
	}
	second := rfbHandshake(t, websocket.NetConn(ctx, ws, websocket.MessageBinary))
	second.frame(t, false)
	if second.colours() < 2 {
		t.Error("the second viewer's screen is blank")
	}
	second.c.Close()
	rc.frame(t, true) // the first viewer is still served

	step("second viewer")

	// A VNC viewer on this machine: dsec sandbox vnc forwards a local port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	local := l.Addr().(*net.TCPAddr).Port
	l.Close()
	fwd := exec.Command(filepath.Join(testutil.Binaries(t), "dsec"), "sandbox", "vnc", sb.ID, strconv.Itoa(local))
	fwd.Env = append(fwd.Environ(), "DSEC_URL="+s.URL, "DSEC_API_KEY="+s.Key)
	if err := fwd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Process.Kill(); fwd.Wait() })
	var viewer net.Conn
	poll(t, 30*time.Second, "dsec sandbox vnc to listen", func() bool {
		viewer, err = net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(local)))
		return err == nil
	})
	third := rfbHandshake(t, viewer)
	third.frame(t, false)
	if third.width != 1024 || third.colours() < 2 {
		t.Errorf("the forwarded viewer's screen: %dx%d, %d colours", third.width, third.height, third.colours())
	}
	viewer.Close()
	step("dsec sandbox vnc")
	// A reset kills x11vnc with every process (its socket file stays);
	// the agent starts it again and the route waits for it.
	if _, err := c.Reset(ctx, sb.ID); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if _, err := io.ReadFull(conn, make([]byte, 1<<20)); err == nil {
		t.Error("the VNC connection outlived the reset's x11vnc")
	}
	step("reset, connection ended")
	poll(t, 30*time.Second, "VNC after the reset", func() bool {
		conn, err = c.DialVNC(ctx, sb.ID)
		if err != nil && !isInvalid(err) { // before the X server is up: no screen yet
			t.Fatalf("vnc after reset: %v", err)
		}
		if err != nil {
			return false
		}
		defer conn.Close()
		rc := rfbHandshake(t, conn)
		rc.frame(t, false)
		return rc.colours() >= 2
	})

	step("VNC after the reset")
	// x11vnc listens on its unix socket only: no TCP port in the sandbox
	// (5900 is 170C in /proc/net/tcp*).
	r, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"})
	if err != nil || strings.Contains(r.Stdout, ":170C") {
		t.Fatalf("x11vnc listens on TCP in the sandbox: %+v, %v", r, err)
	}

	// Without its VNC server the screen is still there, the VNC route is 400.
	// (Its autostart script's process group is x11vnc's: the sandbox's
	// commands may not signal the agent's autostarted processes.)
	if r, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"rm", "/usr/bin/x11vnc"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("remove x11vnc: %+v, %v", r, err)
	}
	ps, err := c.ListProcesses(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	signalled := false
	for _, p := range ps {
		if p.Tag == "autostart:60-vnc" && p.Running {
			if err := c.SignalProcess(ctx, sb.ID, p.ID, "KILL"); err != nil {
				t.Fatalf("kill the VNC server: %v", err)
			}
			signalled = true
		}
	}
	if !signalled {
		t.Fatalf("no running autostart:60-vnc process in %+v", ps)
	}
	poll(t, 15*time.Second, "the VNC route to refuse", func() bool {
		conn, err := c.DialVNC(ctx, sb.ID)
		if err == nil {
			conn.Close()
			return false
		}
		if !isInvalid(err) || !strings.Contains(err.Error(), "no VNC server") || !strings.Contains(err.Error(), "x11vnc") {
			t.Fatalf("vnc without x11vnc: %v", err)
		}
		return true
	})
	if _, err := c.Screenshot(ctx, sb.ID); err != nil {
		t.Fatalf("screenshot without x11vnc: %v", err)
	}

	step("no VNC server: 400")
	plain := newSandbox(t, c, nil)
	if _, err := c.DialVNC(ctx, plain.ID); !isInvalid(err) || !strings.Contains(err.Error(), "no screen") {
		t.Fatalf("vnc of a container without X: %v", err)
	}
	cli := exec.CommandContext(ctx, filepath.Join(testutil.Binaries(t), "dsec"), "sandbox", "vnc", plain.ID, "0")
	cli.Env = append(cli.Environ(), "DSEC_URL="+s.URL, "DSEC_API_KEY="+s.Key)
	if out, err := cli.CombinedOutput(); err == nil || !strings.Contains(string(out), "no screen") {
		t.Fatalf("dsec sandbox vnc of a container without X: %v\n%s", err, out)
	}
	for _, id := range []string{plain.ID, sb.ID} {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	step("no screen: 400; deleted")
	testutil.RequireNoSandboxLeft(t, s)
	poll(t, 10*time.Second, "the desktop's processes to end", func() bool {
		return len(sandboxProcesses(sb.ID, "Xvfb", "xterm", "x11vnc")) == 0
	})
}
