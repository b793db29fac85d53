// Package dockerfile reads a Dockerfile into the stages and instructions
// a layer build runs, with buildkit's parser (the syntax: continuation
// lines, JSON and shell forms, heredocs refused, parser directives) and
// this package's checks (which instructions and flags dsec builds). It
// expands build arguments and environment variables with buildkit's shell
// lexer. It does no I/O besides reading the Dockerfile and must never run
// anything.
package dockerfile

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// MaxBytes bounds a Dockerfile.
const MaxBytes = 1 << 20

// Error is a mistake in a Dockerfile, at a line (0: the file as a whole).
type Error struct {
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line == 0 {
		return "Dockerfile: " + e.Msg
	}
	return fmt.Sprintf("Dockerfile line %d: %s", e.Line, e.Msg)
}

// Unwrap makes an Error an invalid argument.
func (e *Error) Unwrap() error { return errdefs.ErrInvalid }

func lineErr(line int, format string, args ...any) error {
	return &Error{Line: line, Msg: fmt.Sprintf(format, args...)}
}

// Instruction is one instruction of a stage.
type Instruction struct {
	Line int
	// Cmd is the instruction, lower case: run, copy, env...
	Cmd string
	// Args are its arguments as parsed (not expanded): for RUN in shell
	// form one string, in JSON form the argv; for ENV and LABEL key,
	// value pairs (values still quoted: Expand unquotes); for COPY the sources then the destination.
	Args []string
	// JSON says the arguments were given in JSON (exec) form.
	JSON bool
	// Flags are its --name=value flags.
	Flags    map[string]string
	Original string
}

// Stage is one FROM and what follows it.
type Stage struct {
	Line  int
	From  string // not expanded
	Name  string // its AS name, lower case, or ""
	Steps []Instruction
}

// File is a parsed Dockerfile.
type File struct {
	// Args are the ARGs before the first FROM (they may be used in FROM).
	Args   []Instruction
	Stages []Stage
}

// flags each instruction takes; instructions not here are not built.
var flags = map[string][]string{
	"run":        {"network"},
	"copy":       {"from", "chown", "chmod"},
	"add":        {"chown", "chmod"},
	"env":        nil,
	"workdir":    nil,
	"user":       nil,
	"arg":        nil,
	"label":      nil,
	"entrypoint": nil,
	"cmd":        nil,
	"expose":     nil,
	"maintainer": nil,
	"stopsignal": nil,
}

// Parse reads a Dockerfile.
func Parse(r io.Reader) (*File, error) {
	res, err := parser.Parse(io.LimitReader(r, MaxBytes+1))
	if err != nil {
		return nil, &Error{Msg: err.Error()}
	}
	f := &File{}
	for _, n := range res.AST.Children {
		in, err := instruction(n)
		if err != nil {
			return nil, err
		}
		switch {
		case in.Cmd == "from":
			st := Stage{Line: in.Line}
			switch len(in.Args) {
			case 1:
			case 3:
				if !strings.EqualFold(in.Args[1], "as") {
					return nil, lineErr(in.Line, "FROM takes IMAGE [AS NAME]")
				}
				st.Name = strings.ToLower(in.Args[2])
			default:
				return nil, lineErr(in.Line, "FROM takes IMAGE [AS NAME]")
			}
			st.From = in.Args[0]
			f.Stages = append(f.Stages, st)
		case len(f.Stages) == 0 && in.Cmd == "arg":
			f.Args = append(f.Args, in)
		case len(f.Stages) == 0:
			return nil, lineErr(in.Line, "%s before the first FROM", strings.ToUpper(in.Cmd))
		default:
			last := &f.Stages[len(f.Stages)-1]
			last.Steps = append(last.Steps, in)
		}
	}
	if len(f.Stages) == 0 {
		return nil, &Error{Msg: "no FROM"}
	}
	names := map[string]bool{}
	for _, st := range f.Stages {
		if st.Name != "" && names[st.Name] {
			return nil, lineErr(st.Line, "stage name %q is used twice", st.Name)
		}
		names[st.Name] = true
	}
	return f, nil
}

func instruction(n *parser.Node) (Instruction, error) {
	cmd := strings.ToLower(n.Value)
	in := Instruction{Line: n.StartLine, Cmd: cmd, JSON: n.Attributes["json"], Original: n.Original,
		Flags: map[string]string{}}
	allowed, ok := flags[cmd]
	if !ok && cmd != "from" {
		known := make([]string, 0, len(flags))
		for k := range flags {
			known = append(known, strings.ToUpper(k))
		}
		sort.Strings(known)
		return in, lineErr(in.Line, "unknown or unsupported instruction %s (dsec builds FROM, %s)",
			strings.ToUpper(cmd), strings.Join(known, ", "))
	}
	if len(n.Heredocs) > 0 {
		return in, lineErr(in.Line, "heredocs are not supported")
	}
	for _, fl := range n.Flags {
		k, v, _ := strings.Cut(strings.TrimPrefix(fl, "--"), "=")
		if cmd == "from" && k == "platform" {
			continue // one platform: this machine's
		}
		if !slices.Contains(allowed, k) {
			return in, lineErr(in.Line, "%s does not take the flag --%s", strings.ToUpper(cmd), k)
		}
		in.Flags[k] = v
	}
	for a := n.Next; a != nil; a = a.Next {
		in.Args = append(in.Args, a.Value)
	}
	switch cmd {
	case "run", "entrypoint", "cmd":
		if len(in.Args) == 0 {
			return in, lineErr(in.Line, "%s needs a command", strings.ToUpper(cmd))
		}
	case "copy", "add":
		if len(in.Args) < 2 {
			return in, lineErr(in.Line, "%s needs a source and a destination", strings.ToUpper(cmd))
		}
	case "from", "workdir", "user", "arg":
		if len(in.Args) == 0 {
			return in, lineErr(in.Line, "%s needs an argument", strings.ToUpper(cmd))
		}
	case "env", "label":
		// The parser gives key, value, separator triples; keep the pairs.
		if len(in.Args) == 0 || len(in.Args)%3 != 0 {
			return in, lineErr(in.Line, "%s needs KEY=VALUE pairs", strings.ToUpper(cmd))
		}
		var pairs []string
		for i := 0; i < len(in.Args); i += 3 {
			pairs = append(pairs, in.Args[i], in.Args[i+1])
		}
		in.Args = pairs
	}
	return in, nil
}

// Env is an ordered set of variables for expansion.
type Env struct {
	keys []string
	m    map[string]string
}

// Get implements shell.EnvGetter.
func (e *Env) Get(k string) (string, bool) { v, ok := e.m[k]; return v, ok }

// Keys implements shell.EnvGetter.
func (e *Env) Keys() []string { return e.keys }

// Set sets a variable.
func (e *Env) Set(k, v string) {
	if e.m == nil {
		e.m = map[string]string{}
	}
	if _, ok := e.m[k]; !ok {
		e.keys = append(e.keys, k)
	}
	e.m[k] = v
}

// Clone copies e.
func (e *Env) Clone() *Env {
	c := &Env{}
	for _, k := range e.keys {
		c.Set(k, e.m[k])
	}
	return c
}

// Map is e as a map.
func (e *Env) Map() map[string]string {
	out := make(map[string]string, len(e.keys))
	for _, k := range e.keys {
		out[k] = e.m[k]
	}
	return out
}

var lex = shell.NewLex('\\')

// Expand expands $VAR and ${VAR...} in a word.
func Expand(line int, word string, env *Env) (string, error) {
	if env == nil {
		env = &Env{}
	}
	out, _, err := lex.ProcessWord(word, env)
	if err != nil {
		return "", lineErr(line, "expand %q: %v", word, err)
	}
	return out, nil
}
