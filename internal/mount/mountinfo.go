package mount

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Info is one line of /proc/self/mountinfo (see proc(5)).
type Info struct {
	ID, Parent   int
	Major, Minor uint32
	// Root is the directory of the file system mounted here.
	Root       string
	Mountpoint string
	// Options are the per-mount options (ro, nodev, ...).
	Options string
	// Optional holds the tagged fields (shared:N, master:N, ...).
	Optional     []string
	FSType       string
	Source       string
	SuperOptions string
}

// Mountinfo lists the mounts of this process's mount namespace, in the
// kernel's order: a mount comes after the one it is mounted on.
func Mountinfo() ([]Info, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	infos, err := parseMountinfo(f)
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return infos, nil
}

// ThreadMountinfo lists the mounts of the calling thread's mount
// namespace, which differs from the process's on a thread that entered
// another one (the caller must be locked to its thread).
func ThreadMountinfo() ([]Info, error) {
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	infos, err := parseMountinfo(f)
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return infos, nil
}

// MountsUnder lists the mounts at dir or below it, in Mountinfo order.
func MountsUnder(dir string) ([]Info, error) {
	infos, err := Mountinfo()
	if err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	prefix := dir + "/"
	if dir == "/" {
		prefix = "/"
	}
	var under []Info
	for _, m := range infos {
		if m.Mountpoint == dir || strings.HasPrefix(m.Mountpoint, prefix) {
			under = append(under, m)
		}
	}
	return under, nil
}

func parseMountinfo(r io.Reader) ([]Info, error) {
	var infos []Info
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if sc.Text() == "" {
			continue
		}
		m, err := parseMountinfoLine(sc.Text())
		if err != nil {
			return nil, err
		}
		infos = append(infos, m)
	}
	return infos, sc.Err()
}

// parseMountinfoLine parses
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// where any number of optional fields precede the "-".
func parseMountinfoLine(line string) (Info, error) {
	f := strings.Split(line, " ")
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || len(f) < sep+4 {
		return Info{}, fmt.Errorf("malformed mountinfo line %q", line)
	}
	var m Info
	var err error
	if m.ID, err = strconv.Atoi(f[0]); err != nil {
		return Info{}, fmt.Errorf("mountinfo line %q: id: %w", line, err)
	}
	if m.Parent, err = strconv.Atoi(f[1]); err != nil {
		return Info{}, fmt.Errorf("mountinfo line %q: parent: %w", line, err)
	}
	maj, min, ok := strings.Cut(f[2], ":")
	if !ok {
		return Info{}, fmt.Errorf("mountinfo line %q: bad device %q", line, f[2])
	}
	ma, err1 := strconv.ParseUint(maj, 10, 32)
	mi, err2 := strconv.ParseUint(min, 10, 32)
	if err1 != nil || err2 != nil {
		return Info{}, fmt.Errorf("mountinfo line %q: bad device %q", line, f[2])
	}
	m.Major, m.Minor = uint32(ma), uint32(mi)
	m.Root = unescape(f[3])
	m.Mountpoint = unescape(f[4])
	m.Options = f[5]
	if sep > 6 {
		m.Optional = f[6:sep]
	}
	m.FSType = unescape(f[sep+1])
	m.Source = unescape(f[sep+2])
	m.SuperOptions = unescape(strings.Join(f[sep+3:], " "))
	return m, nil
}

// unescape undoes the kernel's octal escapes (\040 for a space, \011 tab,
// \012 newline, \134 backslash) in a mountinfo field.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && '0' <= s[i+1] && s[i+1] <= '3' && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return '0' <= c && c <= '7' }
