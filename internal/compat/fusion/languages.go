package fusion

import "slices"

// sfLanguages is SandboxFusion's Language enum: a name outside it is a
// 422, as pydantic answers; a name in it that this server has no runner
// for is a SandboxError, as SandboxFusion answers for sql.
var sfLanguages = []string{
	"python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql",
	"rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit",
	"kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket",
}

func knownLanguage(l string) bool { return slices.Contains(sfLanguages, l) }

// language is how one language is compiled (if at all) and run, in the
// work dir, with SandboxFusion's commands. A toolchain the base lacks
// shows as exit code 127 ("command not found") of the step.
type language struct {
	file    string
	compile []string
	run     []string
}

// languages are the runners of this server. Names are looked up on PATH
// by the agent; python is python3 (Debian has no "python").
var languages = map[string]language{
	"python":  {file: "main.py", run: []string{"python3", "main.py"}},
	"pytest":  {file: "test_main.py", run: []string{"python3", "-m", "pytest", "test_main.py"}},
	"bash":    {file: "main.sh", run: []string{"/bin/bash", "main.sh"}},
	"cpp":     {file: "main.cpp", compile: []string{"g++", "-std=c++17", "main.cpp", "-o", "test"}, run: []string{"./test"}},
	"go":      {file: "main.go", compile: []string{"go", "build", "-o", "out", "main.go"}, run: []string{"./out"}},
	"go_test": {file: "main_test.go", run: []string{"go", "test", "main_test.go"}},
	"nodejs":  {file: "main.js", run: []string{"node", "main.js"}},
	"rust":    {file: "main.rs", compile: []string{"rustc", "main.rs", "-o", "test"}, run: []string{"./test"}},
	"java":    {file: "Main.java", compile: []string{"javac", "Main.java"}, run: []string{"java", "-ea", "Main"}},
	"php":     {file: "main.php", run: []string{"php", "-f", "main.php"}},
	"lua":     {file: "main.lua", run: []string{"lua", "main.lua"}},
	"perl":    {file: "main.pl", run: []string{"perl", "main.pl"}},
	"ruby":    {file: "main.rb", run: []string{"ruby", "main.rb"}},
	"R":       {file: "main.R", run: []string{"Rscript", "main.R"}},
	"julia":   {file: "main.jl", run: []string{"julia", "main.jl"}},
	"racket":  {file: "main.rkt", run: []string{"racket", "main.rkt"}},
}
