// Package layer turns what users upload into read-only EROFS layer images
// and keeps them in a content-addressed store.
//
// A layer arrives as a tar stream (an OCI layer, a pack_diff upper dir, a
// workspace) or as a finished EROFS image. ExtractTar lays a tar out in a
// directory exactly as the kernel will later show it through overlayfs,
// converting OCI whiteouts to overlay whiteouts on the way; Build runs
// mkfs.erofs over that directory and names the result by its SHA-256;
// LocalStore keeps images under dir/sha256/<hex>.erofs. FromTar chains the
// three. MinimalBase lays out the busybox rootfs that serves as the default
// base layer.
//
// What this package must never do: write, link or change anything outside
// the directory it was given, whatever the tar says (no path, symlink or hard
// link in a tar may reach out of it); keep a half-written image under its
// final name; or mount anything (package mount does that).
package layer
