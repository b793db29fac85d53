package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FileRules are the file system restrictions of a policy phase, applied
// with Landlock to every command started while they are in force. A
// command keeps the rules it was started with for its whole life, and so
// do its children: a later, looser phase never frees it.
type FileRules struct {
	// Deny: nothing beneath these paths can be read, written, executed or
	// created.
	Deny []string `json:"deny,omitempty"`
	// ReadOnly: beneath these paths files can be read and executed and
	// directories listed, nothing else.
	ReadOnly []string `json:"read_only,omitempty"`
}

func (r FileRules) empty() bool { return len(r.Deny) == 0 && len(r.ReadOnly) == 0 }

// Landlock rights (linux/landlock.h) by the ABI version that brought them.
const (
	llReadOnly = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	// fileRights are the rights that mean something on a non-directory.
	fileRights = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
		unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
)

// llRulesetAttr is struct landlock_ruleset_attr up to ABI 6.
type llRulesetAttr struct {
	HandledFS  uint64
	HandledNet uint64
	Scoped     uint64
}

var llABI = sync.OnceValue(func() int {
	v, _, errno := syscall.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(v)
})

// handledFS is every file system right the running kernel knows.
func handledFS(abi int) uint64 {
	var r uint64 = 0x1fff // ABI 1: EXECUTE … MAKE_SYM
	if abi >= 2 {
		r |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= 3 {
		r |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if abi >= 5 {
		r |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	}
	return r
}

// restrictThread confines the calling OS thread, and every process it
// forks from now on, to rules. Without file rules it still scopes signals
// and abstract unix sockets (ABI 6), so that commands cannot signal the
// agent. The thread must never run anything else afterwards.
func restrictThread(root string, rules FileRules) error {
	abi := llABI()
	if abi == 0 {
		if !rules.empty() {
			return errors.New("the kernel has no Landlock: cannot enforce the phase's file rules")
		}
		return nil
	}
	attr := llRulesetAttr{}
	size := unsafe.Sizeof(uint64(0))
	if !rules.empty() {
		attr.HandledFS = handledFS(abi)
	}
	if abi >= 6 {
		attr.Scoped = unix.LANDLOCK_SCOPE_SIGNAL | unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
		size = unsafe.Sizeof(attr)
	}
	if attr.HandledFS == 0 && attr.Scoped == 0 {
		return nil
	}
	fd, _, errno := syscall.RawSyscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if errno != 0 {
		return fmt.Errorf("landlock ruleset: %w", errno)
	}
	defer unix.Close(int(fd))
	if attr.HandledFS != 0 {
		if err := addFileRules(int(fd), root, rules, attr.HandledFS); err != nil {
			return err
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if _, _, errno := syscall.RawSyscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock restrict: %w", errno)
	}
	return nil
}

// addFileRules grants every right everywhere except beneath the
// restricted paths. Landlock only grants, and a grant on a directory
// covers all beneath it, so the grants go to the siblings of each
// restricted path and of each of its ancestors; the ancestors themselves
// get READ_DIR only (a listing shows the restricted entries' names, and no
// new entry can be made directly in an ancestor while the rules hold).
// Symbolic links get no grant of their own: what they point to is judged
// by its own path.
func addFileRules(fd int, root string, rules FileRules, all uint64) error {
	restricted := map[string]uint64{}
	for _, p := range rules.Deny {
		restricted[clean(p)] = 0
	}
	for _, p := range rules.ReadOnly {
		if _, denied := restricted[clean(p)]; !denied {
			restricted[clean(p)] = llReadOnly & all
		}
	}
	ancestors := map[string]bool{}
	for p := range restricted {
		for a := filepath.Dir(p); ; a = filepath.Dir(a) {
			ancestors[a] = true
			if a == "/" {
				break
			}
		}
	}
	for _, a := range slices.Sorted(func(yield func(string) bool) {
		for a := range ancestors {
			if !yield(a) {
				return
			}
		}
	}) {
		if underRestriction(a, restricted) {
			continue // no grant beneath a restriction
		}
		if err := grant(fd, filepath.Join(root, a), unix.LANDLOCK_ACCESS_FS_READ_DIR&all); err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
				continue
			}
			return err
		}
		entries, err := os.ReadDir(filepath.Join(root, a))
		if err != nil {
			continue
		}
		for _, e := range entries {
			child := filepath.Join(a, e.Name())
			if ancestors[child] || e.Type()&os.ModeSymlink != 0 || underRestriction(child, restricted) {
				continue
			}
			if err := grant(fd, filepath.Join(root, child), all); err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
		}
	}
	for p, rights := range restricted {
		if rights == 0 || underOther(p, restricted) {
			continue
		}
		if err := grant(fd, filepath.Join(root, p), rights); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return nil
}

func clean(p string) string { return filepath.Clean("/" + p) }

// underRestriction reports whether p is a restricted path or beneath one.
func underRestriction(p string, restricted map[string]uint64) bool {
	for r := range restricted {
		if p == r || strings.HasPrefix(p, r+"/") || r == "/" {
			return true
		}
	}
	return false
}

// underOther reports whether p lies beneath another restricted path,
// whose (smaller or equal) rights then decide.
func underOther(p string, restricted map[string]uint64) bool {
	for r := range restricted {
		if r != p && (strings.HasPrefix(p, r+"/") || r == "/") {
			return true
		}
	}
	return false
}

// grant adds a path-beneath rule; rights meaningless for a non-directory
// are dropped.
func grant(fd int, path string, rights uint64) error {
	pfd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("landlock rule %s: %w", path, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return fmt.Errorf("landlock rule %s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
	case unix.S_IFLNK:
		return nil
	default:
		rights &= fileRights
	}
	if rights == 0 {
		return nil
	}
	attr := unix.LandlockPathBeneathAttr{Allowed_access: rights, Parent_fd: int32(pfd)}
	_, _, errno := syscall.RawSyscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(fd), unix.LANDLOCK_RULE_PATH_BENEATH,
		uintptr(unsafe.Pointer(&attr)), 0, 0, 0)
	if errno != 0 {
		return fmt.Errorf("landlock rule %s: %w", path, errno)
	}
	return nil
}
