package screen

import (
	"bufio"
	"bytes"
	"fmt"
	"image"
	"image/png"
	"io"
	"strconv"

	"github.com/dsec-project/dsec/api"
)

// MaxPixels bounds a screen image: 8K.
const MaxPixels = 7680 * 4320

// PPMToPNG reads a binary PPM (P6, maxval 255: what QEMU's screendump
// writes) and encodes it as PNG.
func PPMToPNG(r io.Reader) ([]byte, api.Display, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	var hdr [4]int // magic checked apart; width, height, maxval
	magic := make([]byte, 2)
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != "P6" {
		return nil, api.Display{}, fmt.Errorf("screendump: not a binary PPM")
	}
	for i := 1; i < 4; i++ {
		n, err := ppmInt(br)
		if err != nil {
			return nil, api.Display{}, fmt.Errorf("screendump: %w", err)
		}
		hdr[i] = n
	}
	w, h := hdr[1], hdr[2]
	if w <= 0 || h <= 0 || w*h > MaxPixels || hdr[3] != 255 {
		return nil, api.Display{}, fmt.Errorf("screendump: unexpected PPM %dx%d maxval %d", w, h, hdr[3])
	}
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	row := make([]byte, 3*w)
	for y := 0; y < h; y++ {
		if _, err := io.ReadFull(br, row); err != nil {
			return nil, api.Display{}, fmt.Errorf("screendump: short PPM: %w", err)
		}
		px := img.Pix[y*img.Stride:]
		for x := 0; x < w; x++ {
			px[4*x], px[4*x+1], px[4*x+2], px[4*x+3] = row[3*x], row[3*x+1], row[3*x+2], 0xff
		}
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	if err := enc.Encode(&buf, img); err != nil {
		return nil, api.Display{}, err
	}
	return buf.Bytes(), api.Display{Width: w, Height: h}, nil
}

// ppmInt reads a header number, skipping white space and comments, and
// the one white space byte after it.
func ppmInt(br *bufio.Reader) (int, error) {
	var digits []byte
	for {
		c, err := br.ReadByte()
		if err != nil {
			return 0, err
		}
		switch {
		case c == '#' && len(digits) == 0:
			if _, err := br.ReadString('\n'); err != nil {
				return 0, err
			}
		case c >= '0' && c <= '9':
			digits = append(digits, c)
			if len(digits) > 9 {
				return 0, fmt.Errorf("PPM header number too long")
			}
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if len(digits) > 0 {
				return strconv.Atoi(string(digits))
			}
		default:
			return 0, fmt.Errorf("bad byte %q in the PPM header", c)
		}
	}
}
