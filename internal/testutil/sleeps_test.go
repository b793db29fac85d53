package testutil_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A test waits for what it needs by polling with a deadline
// (testutil.Eventually, EventuallyTrue, Poll, PollEvery) or on a channel,
// never by sleeping a fixed time and hoping: a sleep is too short on a
// loaded machine and too long everywhere else. The only sleeps left are
// the behaviour under test (a lease that must run out, a reader late on
// purpose); each says so in a comment starting "// sleep:" on its line or
// the line above. Any other time.Sleep in a test file, or in this
// package's helpers, fails here with its place.
func TestNoUnexplainedSleep(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not at %s: %v", root, err)
	}
	helpers := filepath.Join(root, "internal", "testutil")
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") && !(strings.HasSuffix(path, ".go") && filepath.Dir(path) == helpers) {
			return nil
		}
		files++
		rel, _ := filepath.Rel(root, path)
		for _, line := range unexplainedSleeps(t, path) {
			t.Errorf("%s:%d: time.Sleep without a // sleep: comment saying why it is the behaviour under test; wait with testutil.Eventually or a channel instead", rel, line)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("looked at only %d files under %s", files, root)
	}
}

// unexplainedSleeps returns the lines of the time.Sleep calls in the file
// that have no "// sleep:" comment on their line or the line above.
func unexplainedSleeps(t *testing.T, path string) []int {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), "Sleep(") {
		return nil
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	explained := map[int]bool{}
	for _, g := range f.Comments {
		for _, c := range g.List {
			if strings.HasPrefix(c.Text, "// sleep:") {
				line := fset.Position(c.Pos()).Line
				explained[line] = true
				explained[line+1] = true
			}
		}
	}
	var lines []int
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Sleep" {
			return true
		}
		if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "time" {
			return true
		}
		if line := fset.Position(call.Pos()).Line; !explained[line] {
			lines = append(lines, line)
		}
		return true
	})
	return lines
}
