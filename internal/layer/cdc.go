package layer

import (
	"bufio"
	"io"
	"math/rand/v2"
)

// Content-defined chunking (FastCDC, Xia et al., USENIX ATC '16, with
// normalized chunking): a cut falls where a rolling gear hash of the last
// bytes matches a mask, so the same bytes make the same chunks wherever
// they sit in a blob. That is what lets identical files in two layers, at
// different offsets of their blobs, share their chunks in the store.
//
// The parameters are part of the layer format: changing them changes
// every layer's chunks (not its contents).
const (
	cdcMin = 8 << 10
	cdcAvg = 32 << 10
	cdcMax = 128 << 10
	// Harder to cut below the average, easier above it (normalization
	// level 2), so sizes cluster around cdcAvg.
	cdcMaskSmall = (1 << 17) - 1 // 17 bits: avg log2 + 2
	cdcMaskLarge = (1 << 13) - 1 // 13 bits: avg log2 - 2
)

// gear is the hash's byte table, from a fixed seed so every build of dsec
// cuts alike.
var gear = func() (g [256]uint64) {
	r := rand.New(rand.NewPCG(0x64736563, 0x67656172)) // "dsec", "gear"
	for i := range g {
		g[i] = r.Uint64()
	}
	return g
}()

// chunker splits a stream into content-defined chunks.
type chunker struct {
	r   *bufio.Reader
	buf []byte
}

func newChunker(r io.Reader) *chunker {
	return &chunker{r: bufio.NewReaderSize(r, 1<<20), buf: make([]byte, 0, cdcMax)}
}

// next returns the next chunk, valid until the following call, or io.EOF
// after the last.
func (c *chunker) next() ([]byte, error) {
	c.buf = c.buf[:0]
	var h uint64
	for len(c.buf) < cdcMax {
		b, err := c.r.ReadByte()
		if err == io.EOF {
			if len(c.buf) == 0 {
				return nil, io.EOF
			}
			return c.buf, nil
		}
		if err != nil {
			return nil, err
		}
		c.buf = append(c.buf, b)
		n := len(c.buf)
		if n < cdcMin {
			continue
		}
		h = h<<1 + gear[b]
		mask := uint64(cdcMaskLarge)
		if n < cdcAvg {
			mask = cdcMaskSmall
		}
		if h&mask == 0 {
			return c.buf, nil
		}
	}
	return c.buf, nil
}
