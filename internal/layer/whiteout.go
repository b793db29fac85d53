package layer

import (
	"archive/tar"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// OCI whiteouts (https://github.com/opencontainers/image-spec/blob/main/layer.md)
// and their overlayfs form.
const (
	whiteoutPrefix     = ".wh."
	whiteoutMetaPrefix = ".wh..wh."
	whiteoutOpaque     = ".wh..wh..opq"
	overlayOpaque      = "trusted.overlay.opaque"
	overlayXattrPrefix = "trusted.overlay."
)

// whiteout converts an OCI whiteout entry. Its own owner, mode and content
// do not matter: overlayfs whiteouts are root-owned 0/0 devices, mode 0.
func (x *extractor) whiteout(dir, base string, hdr *tar.Header) error {
	if base != whiteoutOpaque && strings.HasPrefix(base, whiteoutMetaPrefix) {
		// Reserved for the writer's bookkeeping (aufs's .wh..wh.plnk).
		return nil
	}
	parent, err := openBeneath(x.root, dir, true, x.implicitDir)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	if base == whiteoutOpaque {
		if err := unix.Fsetxattr(parent, overlayOpaque, []byte("y"), 0); err != nil {
			return fmt.Errorf("mark %s opaque: %w", dir, err)
		}
		return nil
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return errdefs.Invalid("whiteout %q names nothing", base)
	}
	st, err := lstatAt(parent, name)
	if err != nil {
		return err
	}
	switch {
	case st.dir:
		// Created by this tar, which also deletes the lower one.
		return lsetxattrAt(parent, name, overlayOpaque, []byte("y"))
	case st.exists:
		// Created by this tar; it already hides the lower one.
		return nil
	}
	if err := unix.Mknodat(parent, name, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("create whiteout: %w", err)
	}
	if err := unix.Fchownat(parent, name, 0, 0, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown whiteout: %w", err)
	}
	if err := unix.Fchmodat(parent, name, 0, 0); err != nil {
		return fmt.Errorf("chmod whiteout: %w", err)
	}
	x.stats.Files++
	return setTimesAt(parent, name, mtime(hdr))
}
