// Package contentdigest is the form dsec writes and accepts a content digest in
// (of a layer, a chunk, a prefetch list): "sha256:" and 64 lowercase hex
// digits. It is a package of its own, not part of package layer, so that
// what only checks digests links without layer's archive and compression
// codecs: the sandbox agent, through package mount, is one of them, and
// every package it links is resident in every sandbox.
package contentdigest

import (
	"crypto/sha256"
	"strings"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// Prefix starts every digest.
const Prefix = "sha256:"

// Parse checks that s is "sha256:" and 64 lowercase hex digits, and
// returns the hex part.
func Parse(s string) (string, error) {
	h, ok := strings.CutPrefix(s, Prefix)
	if !ok || len(h) != 2*sha256.Size || strings.IndexFunc(h, notLowerHex) >= 0 {
		return "", errdefs.Invalid("digest %q: want sha256: and 64 lowercase hex digits", s)
	}
	return h, nil
}

func notLowerHex(r rune) bool {
	return !('0' <= r && r <= '9' || 'a' <= r && r <= 'f')
}
