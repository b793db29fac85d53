package agent

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// cleanPath checks a path given to the API and returns it cleaned, and
// relative to the root for openat2 ("." for the root itself).
func cleanPath(p string) (clean, rel string, err error) {
	switch {
	case p == "":
		return "", "", errdefs.Invalid("path is required")
	case hasNUL(p):
		return "", "", errdefs.Invalid("path contains a NUL byte")
	case !strings.HasPrefix(p, "/"):
		return "", "", errdefs.Invalid("path %q is not absolute", p)
	case slices.Contains(strings.Split(p, "/"), ".."):
		return "", "", errdefs.Invalid("path %q has a .. component", p)
	}
	clean = path.Clean(p)
	rel = strings.TrimPrefix(clean, "/")
	if rel == "" {
		rel = "."
	}
	return clean, rel, nil
}

// splitRel splits a relative path into the directory that holds it and
// its last name.
func splitRel(rel string) (dir, name string) {
	dir, name = path.Split(rel)
	if dir = strings.TrimSuffix(dir, "/"); dir == "" {
		dir = "."
	}
	return dir, name
}

// openIn opens rel beneath the root. ".." and symlinks, absolute or not,
// resolve as if the root were "/", so nothing outside it can be reached;
// /proc magic links are refused.
func (s *Server) openIn(rel string, flags int) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	for try := 0; ; try++ {
		fd, err := unix.Openat2(s.root, rel, &how)
		// EAGAIN: a rename raced with the lookup; the kernel asks to retry.
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) && try < 16 {
			continue
		}
		return fd, err
	}
}

// fileError puts an error of a file operation in its class.
func fileError(op, p string, err error) error {
	var class error
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		class = errdefs.ErrNotFound
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.EROFS):
		class = errdefs.ErrPermissionDenied
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENAMETOOLONG), errors.Is(err, unix.EISDIR),
		errors.Is(err, unix.EINVAL), errors.Is(err, io.ErrUnexpectedEOF):
		class = errdefs.ErrInvalid
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EBUSY):
		class = errdefs.ErrFailedPrecondition
	case errors.Is(err, unix.EEXIST):
		class = errdefs.ErrAlreadyExists
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT), errors.Is(err, unix.EMFILE), errors.Is(err, unix.ENFILE):
		class = errdefs.ErrResourceExhausted
	default:
		return fmt.Errorf("%s %s: %w", op, p, err)
	}
	return fmt.Errorf("%s %s: %w: %w", op, p, class, err)
}

// handleGetFile sends a regular file's bytes, or with list=1 a directory's
// entries.
func (s *Server) handleGetFile(w http.ResponseWriter, r *http.Request) {
	clean, rel, err := cleanPath(r.URL.Query().Get("path"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := queryBool(r, "list")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// O_NONBLOCK: opening a FIFO must not wait for a writer.
	fd, err := s.openIn(rel, unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK)
	if err != nil {
		s.writeError(w, r, fileError("open", clean, err))
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		s.writeError(w, r, fileError("stat", clean, err))
		return
	}
	typ := st.Mode & unix.S_IFMT
	switch {
	case list && typ != unix.S_IFDIR:
		err = errdefs.Invalid("list %s: not a directory", clean)
	case !list && typ == unix.S_IFDIR:
		err = errdefs.Invalid("read %s: is a directory; list it with list=1", clean)
	case !list && typ != unix.S_IFREG:
		err = errdefs.Invalid("read %s: not a regular file", clean)
	case !list && st.Size > s.cfg.MaxFileBytes:
		err = fmt.Errorf("read %s: %d bytes is over the limit of %d: %w", clean, st.Size, s.cfg.MaxFileBytes, errdefs.ErrTooLarge)
	}
	if err != nil {
		unix.Close(fd)
		s.writeError(w, r, err)
		return
	}
	f := os.NewFile(uintptr(fd), clean)
	defer f.Close()
	if list {
		fl, err := listDir(f, clean)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, fl)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(st.Size, 10))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := io.CopyN(w, f, st.Size); err != nil {
		logger(r).WarnContext(r.Context(), "send file", "path", clean, "err", err)
	}
}

func listDir(d *os.File, clean string) (*api.FileList, error) {
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fileError("list", clean, err)
	}
	slices.Sort(names)
	fd := int(d.Fd())
	fl := &api.FileList{Path: clean, Entries: make([]api.FileInfo, 0, len(names))}
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed since it was listed
			}
			return nil, fileError("stat", path.Join(clean, name), err)
		}
		fi := api.FileInfo{
			Name:    name,
			Size:    st.Size,
			Mode:    st.Mode & 0o7777,
			ModTime: time.Unix(st.Mtim.Unix()).UTC(),
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			fi.Type = "file"
		case unix.S_IFDIR:
			fi.Type = "dir"
		case unix.S_IFLNK:
			fi.Type = "symlink"
			buf := make([]byte, unix.PathMax)
			if n, err := unix.Readlinkat(fd, name, buf); err == nil {
				fi.Target = string(buf[:n])
			}
		default:
			fi.Type = "other"
		}
		fl.Entries = append(fl.Entries, fi)
	}
	return fl, nil
}

// handlePutFile writes a file atomically: the body goes to a temporary
// file in the same directory, renamed over the target once complete. A
// symlink at the target is replaced, not followed.
func (s *Server) handlePutFile(w http.ResponseWriter, r *http.Request) {
	clean, rel, err := cleanPath(r.URL.Query().Get("path"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if clean == "/" {
		s.writeError(w, r, errdefs.Invalid("cannot write /"))
		return
	}
	mode := uint64(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o7777 {
			s.writeError(w, r, errdefs.Invalid("mode %q is not octal permission bits", m))
			return
		}
	}
	if r.ContentLength > s.cfg.MaxFileBytes {
		s.writeError(w, r, s.tooLarge(clean))
		return
	}
	n, err := s.writeFile(clean, rel, uint32(mode), r.Body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, &api.FileWritten{Path: clean, Size: n})
}

func (s *Server) tooLarge(clean string) error {
	return fmt.Errorf("write %s: over the limit of %d bytes: %w", clean, s.cfg.MaxFileBytes, errdefs.ErrTooLarge)
}

func (s *Server) writeFile(clean, rel string, mode uint32, body io.Reader) (int64, error) {
	dir, name := splitRel(rel)
	dirfd, err := s.mkdirAll(dir)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) {
			return 0, fmt.Errorf("write %s: a parent is not a directory: %w", clean, errdefs.ErrFailedPrecondition)
		}
		return 0, fileError("create parents of", clean, err)
	}
	defer unix.Close(dirfd)
	tmp := "." + name + ".dsec-" + rand.Text()[:12]
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, fileError("create", clean, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	n, err := io.Copy(f, io.LimitReader(body, s.cfg.MaxFileBytes+1))
	switch {
	case err != nil:
		err = fileError("write", clean, err)
	case n > s.cfg.MaxFileBytes:
		err = s.tooLarge(clean)
	default:
		// Exactly mode, whatever the umask.
		if err = unix.Fchmod(fd, mode); err != nil {
			err = fileError("chmod", clean, err)
		}
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fileError("write", clean, cerr)
	}
	if err == nil {
		if err = unix.Renameat(dirfd, tmp, dirfd, name); err != nil {
			err = fileError("rename", clean, err)
		}
	}
	if err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return 0, err
	}
	return n, nil
}

// mkdirAll opens the directory rel beneath the root, creating what is
// missing of it (mode 0755, less the umask), and returns an O_PATH fd.
func (s *Server) mkdirAll(rel string) (int, error) {
	fd, err := s.openIn(rel, unix.O_PATH|unix.O_DIRECTORY)
	if !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	if fd, err = s.openIn(".", unix.O_PATH|unix.O_DIRECTORY); err != nil {
		return -1, err
	}
	parts := strings.Split(rel, "/")
	for i, name := range parts {
		// Each prefix is resolved from the root again, so a symlink
		// among the parents still resolves inside it.
		prefix := strings.Join(parts[:i+1], "/")
		next, err := s.openIn(prefix, unix.O_PATH|unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(fd, name, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = s.openIn(prefix, unix.O_PATH|unix.O_DIRECTORY)
			}
		}
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// handleDeleteFile removes a file, a symlink or an empty directory; with
// recursive=1 a whole tree, never following symlinks out of it.
func (s *Server) handleDeleteFile(w http.ResponseWriter, r *http.Request) {
	clean, rel, err := cleanPath(r.URL.Query().Get("path"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if clean == "/" {
		s.writeError(w, r, errdefs.Invalid("cannot remove /"))
		return
	}
	recursive, err := queryBool(r, "recursive")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.remove(rel, recursive); err != nil {
		s.writeError(w, r, fileError("remove", clean, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) remove(rel string, recursive bool) error {
	dir, name := splitRel(rel)
	dirfd, err := s.openIn(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return unix.Unlinkat(dirfd, name, 0)
	case recursive:
		return removeAll(dirfd, name)
	default:
		return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
	}
}

// removeAll removes name in dirfd and everything beneath it. Directories
// are opened with O_NOFOLLOW, so a symlink is removed, never entered.
func removeAll(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	// Entries created while we empty it make rmdir fail; go round again.
	for try := 0; ; try++ {
		names, err := d.Readdirnames(-1)
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := removeAll(fd, n); err != nil {
				return err
			}
		}
		err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if !errors.Is(err, unix.ENOTEMPTY) || try == 3 {
			return err
		}
		if _, err := d.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
}
