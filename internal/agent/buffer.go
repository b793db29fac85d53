package agent

import (
	"sync"
	"unicode/utf8"
)

// ring keeps the last size bytes written to it and knows the absolute
// offset of each. It allocates as it fills, never beyond size.
type ring struct {
	size  int
	buf   []byte // the byte at offset o is buf[o%size]
	total int64  // bytes ever written
}

func newRing(size int) *ring { return &ring{size: size} }

func (r *ring) write(p []byte) {
	if r.size == 0 {
		r.total += int64(len(p))
		return
	}
	if r.total+int64(len(p)) <= int64(r.size) {
		r.buf = append(grow(r.buf, len(p), r.size), p...) // still filling: len(buf) == total
		r.total += int64(len(p))
		return
	}
	if len(r.buf) < r.size {
		r.buf = grow(r.buf, r.size-len(r.buf), r.size)[:r.size]
	}
	start := r.total
	r.total += int64(len(p))
	if len(p) > r.size {
		start += int64(len(p) - r.size)
		p = p[len(p)-r.size:]
	}
	i := int(start % int64(r.size))
	n := copy(r.buf[i:], p)
	copy(r.buf, p[n:])
}

// oldest is the offset of the first byte still kept.
func (r *ring) oldest() int64 { return max(0, r.total-int64(r.size)) }

// readAt copies bytes from offset off (clamped to the kept range) into dst
// and returns the offset of the first byte copied and the count.
func (r *ring) readAt(off int64, dst []byte) (int64, int) {
	off = min(max(off, r.oldest()), r.total)
	n := int(min(int64(len(dst)), r.total-off))
	if n == 0 {
		return off, 0
	}
	i := int(off % int64(r.size))
	c := copy(dst[:n], r.buf[i:])
	copy(dst[c:n], r.buf)
	return off, n
}

// grow makes room for n more bytes in b, doubling as append would but
// never past limit, so a buffer's memory is bounded by its limit.
func grow(b []byte, n, limit int) []byte {
	if cap(b)-len(b) >= n {
		return b
	}
	nb := make([]byte, len(b), min(limit, max(2*cap(b), len(b)+n, 4<<10)))
	copy(nb, b)
	return nb
}

// headTail keeps the first half and the last half of a capped stream and
// counts what fell in between. Its memory never exceeds the cap.
type headTail struct {
	head    []byte
	headMax int
	tail    *ring
}

func newHeadTail(limit int) *headTail {
	h := limit / 2
	return &headTail{headMax: h, tail: newRing(limit - h)}
}

func (b *headTail) Write(p []byte) (int, error) {
	n := len(p)
	if room := b.headMax - len(b.head); room > 0 {
		k := min(room, len(p))
		b.head = append(grow(b.head, k, b.headMax), p[:k]...)
		p = p[k:]
	}
	if len(p) > 0 {
		b.tail.write(p)
	}
	return n, nil
}

// bytes returns the kept bytes, head then tail, and how many were dropped
// between them. When bytes were dropped, a character cut at either edge of
// the gap is dropped too, so text stays valid text.
func (b *headTail) bytes() ([]byte, int64) {
	kept := int(b.tail.total - b.tail.oldest())
	out := make([]byte, len(b.head), len(b.head)+kept)
	copy(out, b.head)
	tail := make([]byte, kept)
	b.tail.readAt(0, tail)
	dropped := b.tail.oldest()
	if dropped > 0 {
		cut := incompleteSuffix(out)
		out = out[:len(out)-cut]
		skip := 0
		for skip < len(tail) && skip < utf8.UTFMax-1 && !utf8.RuneStart(tail[skip]) {
			skip++
		}
		tail = tail[skip:]
		dropped += int64(cut + skip)
	}
	return append(out, tail...), dropped
}

// incompleteSuffix is the length of a UTF-8 sequence at the end of p that
// was started but not finished (0 if none): the bytes to carry over to the
// next chunk rather than send split.
func incompleteSuffix(p []byte) int {
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			if utf8.FullRune(p[i:]) {
				return 0
			}
			return len(p) - i
		}
	}
	return 0
}

// output is one stream of a background process: a ring that readers may
// follow while the process writes to it.
type output struct {
	mu     sync.Mutex
	ring   *ring
	closed bool          // the stream has ended; no more bytes will come
	wake   chan struct{} // closed, and replaced, on every write and on close
}

func newOutput(size int) *output {
	return &output{ring: newRing(size), wake: make(chan struct{})}
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ring.write(p)
	close(o.wake)
	o.wake = make(chan struct{})
	return len(p), nil
}

func (o *output) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	close(o.wake)
	o.wake = make(chan struct{})
}

// outputState is what a reader of an output sees at one moment.
type outputState struct {
	start, next int64 // offsets of the first byte copied and the one after the last
	dropped     int64 // bytes lost to the ring so far
	closed      bool
	wake        <-chan struct{} // closed on the next write or close
}

// read copies bytes from off into dst; dst nil means "everything kept".
func (o *output) read(off int64, dst []byte) ([]byte, outputState) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if dst == nil {
		dst = make([]byte, o.ring.total-min(max(off, o.ring.oldest()), o.ring.total))
	}
	start, n := o.ring.readAt(off, dst)
	return dst[:n], outputState{
		start:   start,
		next:    start + int64(n),
		dropped: o.ring.oldest(),
		closed:  o.closed,
		wake:    o.wake,
	}
}

func (o *output) size() (total, dropped int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ring.total, o.ring.oldest()
}
