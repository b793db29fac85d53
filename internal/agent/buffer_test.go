package agent

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRing(t *testing.T) {
	tests := []struct {
		name   string
		size   int
		writes []string
		kept   string
		oldest int64
	}{
		{"empty", 4, nil, "", 0},
		{"filling", 8, []string{"ab", "cd"}, "abcd", 0},
		{"exactly full", 4, []string{"ab", "cd"}, "abcd", 0},
		{"wraps", 4, []string{"abc", "def"}, "cdef", 2},
		{"wraps twice", 4, []string{"abc", "def", "ghi"}, "fghi", 5},
		{"write larger than the ring", 4, []string{"a", "bcdefgh"}, "efgh", 4},
		{"zero size keeps nothing", 0, []string{"abc"}, "", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing(tt.size)
			want := ""
			for _, w := range tt.writes {
				r.write([]byte(w))
				want += w
			}
			if r.total != int64(len(want)) || r.oldest() != tt.oldest {
				t.Fatalf("total %d oldest %d, want %d %d", r.total, r.oldest(), len(want), tt.oldest)
			}
			buf := make([]byte, 16)
			start, n := r.readAt(0, buf)
			if start != tt.oldest || string(buf[:n]) != tt.kept {
				t.Errorf("readAt(0) = %d %q, want %d %q", start, buf[:n], tt.oldest, tt.kept)
			}
			// Every offset still kept reads the same bytes as were written.
			for off := tt.oldest; off < r.total; off++ {
				start, n := r.readAt(off, buf[:2])
				if start != off || string(buf[:n]) != want[off:min(off+2, r.total)] {
					t.Errorf("readAt(%d) = %d %q", off, start, buf[:n])
				}
			}
			if start, n := r.readAt(r.total+10, buf); start != r.total || n != 0 {
				t.Errorf("readAt past the end = %d %d", start, n)
			}
		})
	}
}

func TestHeadTail(t *testing.T) {
	tests := []struct {
		name    string
		limit   int
		writes  []string
		want    string
		dropped int64
	}{
		{"under the cap", 8, []string{"abc", "def"}, "abcdef", 0},
		{"at the cap", 6, []string{"abc", "def"}, "abcdef", 0},
		{"over the cap", 6, []string{"abcdefgh", "ijk"}, "abcijk", 5},
		{"many small writes", 4, strings.Split("abcdefghij", ""), "abij", 6},
		{"odd cap gives the tail the extra byte", 5, []string{"abcdefghij"}, "abhij", 5},
		{"a character cut at the head is dropped", 6, []string{"ab\u00e9xxxxxx\u00e9"}, "abx\u00e9", 7},
		{"a character cut at both edges", 5, []string{"a\u00e9", "zz\u00e9zz"}, "azz", 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newHeadTail(tt.limit)
			for _, w := range tt.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("write %d %v", n, err)
				}
			}
			got, dropped := b.bytes()
			if string(got) != tt.want || dropped != tt.dropped {
				t.Errorf("got %q dropped %d, want %q %d", got, dropped, tt.want, tt.dropped)
			}
		})
	}
}

func TestIncompleteSuffix(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want int
	}{
		{"empty", "", 0},
		{"ascii", "abc", 0},
		{"complete two bytes", "a\u00e9", 0},
		{"first of two", "a\xc3", 1},
		{"two of three", "a\xe2\x82", 2},
		{"three of four", "\xf0\x9f\x98", 3},
		{"complete four", "\U0001F600", 0},
		{"invalid byte is not carried", "a\xff", 0},
		{"lone continuation is not carried", "a\x80", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := incompleteSuffix([]byte(tt.in)); got != tt.want {
				t.Errorf("incompleteSuffix(%q) = %d, want %d", tt.in, got, tt.want)
			}
		})
	}
}

func TestEventWriter(t *testing.T) {
	tests := []struct {
		name   string
		chunks []chunk
		want   []string // events, as JSON
	}{
		{"a character split between chunks", []chunk{{streamStdout, []byte("a\xc3")}, {streamStdout, []byte("\xa9b")}},
			[]string{`{"stdout":"a"}`, `{"stdout":"éb"}`}},
		{"carry is per stream", []chunk{{streamStdout, []byte("\xe2\x82")}, {streamStderr, []byte("e")}, {streamStdout, []byte("\xac")}},
			[]string{`{"stderr":"e"}`, `{"stdout":"€"}`}},
		{"an unfinished character at the end is base64", []chunk{{streamStdout, []byte("x\xc3")}},
			[]string{`{"stdout":"x"}`, `{"stdout":"ww==","encoding":"base64"}`}},
		{"invalid bytes are base64", []chunk{{streamStderr, []byte("a\xffb")}},
			[]string{`{"stderr":"Yf9i","encoding":"base64"}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			ew := &eventWriter{enc: json.NewEncoder(rec), rc: http.NewResponseController(rec)}
			for _, c := range tt.chunks {
				ew.add(c)
				ew.flush()
			}
			ew.end()
			got := strings.Split(strings.TrimSpace(rec.Body.String()), "\n")
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestStreamSinkCap(t *testing.T) {
	ch := make(chan chunk, 10)
	s := &streamSink{stream: streamStdout, ch: ch, gone: make(chan struct{}), left: 5}
	for _, w := range []string{"abc", "defg", "hij"} {
		if n, _ := s.Write([]byte(w)); n != len(w) {
			t.Fatalf("short write %d", n)
		}
	}
	close(ch)
	var got bytes.Buffer
	for c := range ch {
		got.Write(c.data)
	}
	if got.String() != "abcde" || s.dropped != 5 {
		t.Errorf("passed %q, dropped %d", got.String(), s.dropped)
	}
}

func TestCleanPath(t *testing.T) {
	tests := []struct {
		in, clean, rel string
		ok             bool
	}{
		{"/", "/", ".", true},
		{"/a/b", "/a/b", "a/b", true},
		{"//a/./b/", "/a/b", "a/b", true},
		{"/a..b/c", "/a..b/c", "a..b/c", true},
		{"", "", "", false},
		{"a", "", "", false},
		{"./a", "", "", false},
		{"/..", "", "", false},
		{"/a/../b", "", "", false},
		{"/a/..", "", "", false},
		{"/a\x00", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			clean, rel, err := cleanPath(tt.in)
			if (err == nil) != tt.ok || clean != tt.clean || rel != tt.rel {
				t.Errorf("cleanPath(%q) = %q %q %v", tt.in, clean, rel, err)
			}
		})
	}
}

func TestMergeEnv(t *testing.T) {
	got, err := mergeEnv([]string{"A=1", "B=2", "C=3"}, map[string]string{"B": "x", "Z": "z", "D": ""})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != "A=1 C=3 B=x D= Z=z" {
		t.Errorf("merged %v", got)
	}
}

func TestLogWriter(t *testing.T) {
	var out bytes.Buffer
	w := NewLogWriter(&out, 11)
	for _, s := range []string{"12345\n", "1234\n", "more\n", "and more\n"} {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("write %d %v", n, err)
		}
	}
	if want := "12345\n1234\n" + logCapped; out.String() != want {
		t.Errorf("logged %q, want %q", out.String(), want)
	}
}

func TestParseSignal(t *testing.T) {
	for _, name := range []string{"TERM", "SIGTERM", "term", "KILL", "INT", "HUP"} {
		if _, ok := parseSignal(name); !ok {
			t.Errorf("parseSignal(%q) failed", name)
		}
	}
	for _, name := range []string{"", "SIG", "STOP", "9"} {
		if _, ok := parseSignal(name); ok {
			t.Errorf("parseSignal(%q) accepted", name)
		}
	}
}
