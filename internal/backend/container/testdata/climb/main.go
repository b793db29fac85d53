// Command climb tries the classic way out of a chroot from inside a
// sandbox: chroot into a subdirectory while the working directory stays
// outside it, climb with "..", and make where it ended the root. It prints
// the names in that root, one a line, so a test can tell whether it got
// anywhere the sandbox's own root does not show.
package main

import (
	"fmt"
	"os"
	"syscall"
)

func main() {
	if err := os.MkdirAll("/tmp/climb", 0o755); err != nil {
		fail(err)
	}
	if err := syscall.Chdir("/"); err != nil {
		fail(err)
	}
	if err := syscall.Chroot("/tmp/climb"); err != nil {
		fail(err)
	}
	for range 64 {
		if err := syscall.Chdir(".."); err != nil {
			fail(err)
		}
	}
	if err := syscall.Chroot("."); err != nil {
		fail(err)
	}
	ents, err := os.ReadDir("/")
	if err != nil {
		fail(err)
	}
	for _, e := range ents {
		fmt.Println(e.Name())
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "climb:", err)
	os.Exit(1)
}
