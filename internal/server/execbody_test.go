package server

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/internal/errdefs"
)

func TestExecBody(t *testing.T) {
	pad := func(n int) string { return strings.Repeat("x", n) }
	for _, tc := range []struct {
		name, body string
		onDisk     bool
		has        bool
	}{
		{"small, with", `{"trajectory": 1}`, false, true},
		{"small, without", `{"shell": "true"}`, false, false},
		{"large, at the end", pad(memExecBody+10) + "trajectory", true, true},
		{"large, across a read boundary", pad(64<<10-4) + "trajectory" + pad(memExecBody), true, true},
		{"large, without", pad(3 * memExecBody), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := readExecBody(httptest.NewRequest("POST", "/", strings.NewReader(tc.body)), t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer b.close()
			if (b.file != nil) != tc.onDisk || b.size != int64(len(tc.body)) {
				t.Fatalf("on disk %v, size %d", b.file != nil, b.size)
			}
			if got := b.contains("trajectory"); got != tc.has {
				t.Fatalf("contains = %v", got)
			}
			all, err := b.all()
			if err != nil || string(all) != tc.body {
				t.Fatalf("all: %d bytes, %v", len(all), err)
			}
			rest, err := io.ReadAll(b.reader())
			if err != nil || string(rest) != tc.body {
				t.Fatalf("reader: %d bytes, %v", len(rest), err)
			}
		})
	}
	_, err := readExecBody(httptest.NewRequest("POST", "/", strings.NewReader(pad(maxExecBody+1))), t.TempDir())
	if !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
}
