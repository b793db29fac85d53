package testutil_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every package of the module says what it is (and, by house style, what
// it must never do) in a doc comment: a package without one fails here.
func TestEveryPackageHasADocComment(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not at %s: %v", root, err)
	}
	documented := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "sdk") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		if strings.Contains(f.Name.Name, "_test") {
			return nil
		}
		dir := filepath.Dir(path)
		documented[dir] = documented[dir] || f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != ""
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, ok := range documented {
		if !ok {
			rel, _ := filepath.Rel(root, dir)
			t.Errorf("package %s has no doc comment (// Package %s ... above its package clause)", rel, filepath.Base(dir))
		}
	}
	if len(documented) < 10 {
		t.Fatalf("found only %d packages under %s", len(documented), root)
	}
}
