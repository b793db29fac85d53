// Package layer turns what users upload into read-only EROFS layers and
// keeps them in the cluster's shared store.
//
// A layer arrives as a tar stream (an OCI layer, a workspace), a directory
// (a pack_diff upper dir, a debootstrapped tree) or a finished EROFS image.
// ExtractTar lays a tar out in a directory exactly as the kernel will later
// show it through overlayfs, converting OCI whiteouts to overlay whiteouts
// on the way. Store.Build runs mkfs.erofs over a directory with the data
// split off into a blob device, and stores the layer in a blob.Store in the
// chunked format described by Manifest: a metadata image and a blob, both
// cut into content-defined, zstd-compressed chunks named by their SHA-256
// and stored once across all layers. FromTar chains extraction and build;
// Squash merges overlay layer directories for flattening snapshots;
// Store.Remove deletes layers and the chunks no other layer names;
// MinimalBase lays out the busybox rootfs of the default base layer; Build
// makes one EROFS image of a directory.
//
// What this package must never do: write, link or change anything outside
// the directory it was given, whatever the tar says (no path, symlink or hard
// link in a tar may reach out of it); keep a half-written image or object
// under its final name; hand out a chunk whose bytes do not match its
// digest; delete a chunk another stored manifest names; or mount anything
// (package mount does that).
package layer
