package dockerfile

import (
	"errors"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/internal/errdefs"
)

func TestParse(t *testing.T) {
	f, err := Parse(strings.NewReader(`# syntax is ignored
ARG BASE=base:minimal
FROM ${BASE} AS build
ENV A=1 B="two words"
RUN echo $A \
    && echo done
COPY --chown=1:2 a b /dst/
FROM base:minimal
COPY --from=build /out /out
CMD ["sh", "-c", "echo hi"]
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Args) != 1 || len(f.Stages) != 2 || f.Stages[0].Name != "build" || f.Stages[0].From != "${BASE}" {
		t.Fatalf("parsed %+v", f)
	}
	st := f.Stages[0].Steps
	if st[0].Cmd != "env" || strings.Join(st[0].Args, "|") != "A|1|B|\"two words\"" {
		t.Fatalf("env %+v", st[0])
	}
	if st[1].Cmd != "run" || st[1].Line != 5 || len(st[1].Args) != 1 || !strings.Contains(st[1].Args[0], "done") {
		t.Fatalf("run %+v", st[1])
	}
	if st[2].Flags["chown"] != "1:2" || strings.Join(st[2].Args, "|") != "a|b|/dst/" {
		t.Fatalf("copy %+v", st[2])
	}
	last := f.Stages[1].Steps
	if last[0].Flags["from"] != "build" || !last[1].JSON || strings.Join(last[1].Args, "|") != "sh|-c|echo hi" {
		t.Fatalf("second stage %+v", last)
	}
	env := &Env{}
	env.Set("BASE", "x:1")
	if got, err := Expand(1, "${BASE}-$NOPE", env); err != nil || got != "x:1-" {
		t.Fatalf("expand = %q, %v", got, err)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, src string
		line      int
		want      string
	}{
		{"unknown instruction", "FROM a\nFROBNICATE x\n", 2, "FROBNICATE"},
		{"unsupported instruction", "FROM a\nHEALTHCHECK NONE\n", 2, "HEALTHCHECK"},
		{"no from", "RUN true\n", 1, "before the first FROM"},
		{"empty", "# nothing\n", 0, "no instructions"},
		{"bad flag", "FROM a\nCOPY --link a b\n", 2, "--link"},
		{"copy without dest", "FROM a\nCOPY a\n", 2, "source and a destination"},
		{"stage twice", "FROM a AS x\nFROM b AS x\n", 2, "twice"},
		{"bad from", "FROM a AT b\n", 1, "FROM takes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.src))
			var de *Error
			if !errors.As(err, &de) || de.Line != tc.line || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("Parse = %v, want line %d with %q", err, tc.line, tc.want)
			}
		})
	}
}
