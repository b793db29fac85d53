package server

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dsec-project/dsec/api"
)

func TestChunker(t *testing.T) {
	euro := "€" // 3 bytes
	long := strings.Repeat("a", maxChunk-1) + euro + "tail"
	for _, tc := range []struct {
		name   string
		writes []string
		text   bool // every chunk must go as text
	}{
		{"a character split across writes", []string{"x" + euro[:1], euro[1:2], euro[2:] + "y"}, true},
		{"a chunk boundary inside a character", []string{long}, true},
		{"bytes that are not UTF-8", []string{"ok\xff", "\xfe end"}, false},
		{"an incomplete character at the end", []string{"abc" + euro[:2]}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got bytes.Buffer
			c := chunker{stream: "stdout", emit: func(ev api.ExecEvent) {
				if ev.Stdout == nil || ev.Stderr != nil {
					t.Fatalf("event on the wrong stream: %+v", ev)
				}
				b, err := ev.Bytes()
				if err != nil {
					t.Fatal(err)
				}
				if len(b) > maxChunk {
					t.Errorf("chunk of %d bytes", len(b))
				}
				if ev.Encoding == "" && !utf8.Valid(b) {
					t.Errorf("text chunk %q is not UTF-8", b)
				}
				if ev.Encoding != "" && tc.text {
					t.Errorf("valid UTF-8 sent as base64: %q", b)
				}
				got.Write(b)
			}}
			var want string
			for _, w := range tc.writes {
				c.write([]byte(w))
				want += w
			}
			c.flush()
			if got.String() != want {
				t.Fatalf("got %q, want %q", got.String(), want)
			}
		})
	}
}
