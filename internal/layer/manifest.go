package layer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// ManifestVersion is the layer format this code writes and reads.
const ManifestVersion = 1

// A Manifest describes one layer in the store. Its SHA-256 is the layer's
// digest. A layer is two files on a node:
//   - Meta, an EROFS image with every inode, directory and xattr of the
//     layer: small, always fetched whole to node disk, and the mount
//     source;
//   - Blob, the data device of that image (mkfs.erofs --blobdev), named in
//     the mount with device=: large, and read on demand through blobfs.
//
// Blob is nil for a layer uploaded as a finished EROFS image: Meta is then
// the whole image (fetched whole, mounted alone).
type Manifest struct {
	Version int   `json:"version"`
	Meta    Part  `json:"meta"`
	Blob    *Part `json:"blob,omitempty"`
}

// Part is one file of a layer as a sequence of chunks; a chunk's offset in
// the file is the sum of the sizes before it.
type Part struct {
	Size   int64   `json:"size"`
	Chunks []Chunk `json:"chunks"`
}

// Chunk is a piece of a layer file, stored zstd-compressed under its
// digest. Chunks with equal bytes are stored once, across all layers.
type Chunk struct {
	// Digest is "sha256:<hex>" of the uncompressed bytes.
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// Offsets returns each chunk's offset in the part.
func (p *Part) Offsets() []int64 {
	offs := make([]int64, len(p.Chunks))
	var off int64
	for i, c := range p.Chunks {
		offs[i] = off
		off += c.Size
	}
	return offs
}

// ChunkAt returns the index of the chunk that holds byte off, given the
// part's Offsets.
func ChunkAt(offsets []int64, off int64) int {
	return sort.Search(len(offsets), func(i int) bool { return offsets[i] > off }) - 1
}

// Total is the uncompressed size of the layer's files.
func (m *Manifest) Total() int64 {
	n := m.Meta.Size
	if m.Blob != nil {
		n += m.Blob.Size
	}
	return n
}

// encode is the manifest's canonical bytes: Go's JSON of the struct, whose
// field order is fixed.
func (m *Manifest) encode() ([]byte, error) {
	return json.Marshal(m)
}

// digestOf is the "sha256:<hex>" of b.
func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return contentdigest.Prefix + hex.EncodeToString(sum[:])
}

// ParseManifest decodes and checks a manifest whose bytes must hash to
// digest.
func ParseManifest(digest string, b []byte) (*Manifest, error) {
	if got := digestOf(b); got != digest {
		return nil, fmt.Errorf("manifest %s: bytes hash to %s: %w", digest, got, errdefs.ErrInvalid)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", digest, errdefs.Invalid("%v", err))
	}
	if m.Version != ManifestVersion {
		return nil, fmt.Errorf("manifest %s: %w", digest, errdefs.Invalid("version %d, want %d", m.Version, ManifestVersion))
	}
	for _, p := range []*Part{&m.Meta, m.Blob} {
		if p == nil {
			continue
		}
		var sum int64
		for _, c := range p.Chunks {
			if _, err := contentdigest.Parse(c.Digest); err != nil || c.Size <= 0 {
				return nil, fmt.Errorf("manifest %s: %w", digest, errdefs.Invalid("bad chunk %+v", c))
			}
			sum += c.Size
		}
		if sum != p.Size {
			return nil, fmt.Errorf("manifest %s: %w", digest, errdefs.Invalid("chunks add up to %d, not %d", sum, p.Size))
		}
	}
	return &m, nil
}
