package bench

import (
	"os/exec"
	"runtime"
	"testing"
)

func TestNothingExecutableExitsZero(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		if _, err := nothingELF(); err == nil {
			t.Fatal("nothingELF built an executable for a machine it does not know")
		}
		return
	}
	p, err := writeNothing(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(p, "ignored").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v %q", p, err, out)
	}
	if len(out) != 0 {
		t.Fatalf("it wrote %q", out)
	}
}
