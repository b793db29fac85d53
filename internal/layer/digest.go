package layer

import (
	"crypto/sha256"
	"strings"

	"github.com/dsec-project/dsec/internal/errdefs"
)

const digestPrefix = "sha256:"

// ParseDigest checks that s is "sha256:" and 64 lowercase hex digits, and
// returns the hex part.
func ParseDigest(s string) (string, error) {
	h, ok := strings.CutPrefix(s, digestPrefix)
	if !ok || len(h) != 2*sha256.Size || strings.IndexFunc(h, notLowerHex) >= 0 {
		return "", errdefs.Invalid("digest %q: want sha256: and 64 lowercase hex digits", s)
	}
	return h, nil
}

func notLowerHex(r rune) bool {
	return !('0' <= r && r <= '9' || 'a' <= r && r <= 'f')
}
