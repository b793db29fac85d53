package contentdigest_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/errdefs"
)

func TestParse(t *testing.T) {
	hex64 := strings.Repeat("0123456789abcdef", 4)
	tests := []struct {
		in      string
		wantHex string
	}{
		{"sha256:" + hex64, hex64},
		{hex64, ""},
		{"sha256:" + strings.ToUpper(hex64), ""},
		{"sha256:" + hex64[:63], ""},
		{"sha256:" + hex64 + "0", ""},
		{"sha512:" + hex64, ""},
		{"sha256:" + hex64[:63] + "g", ""},
		{"sha256:../../../../etc/passwd", ""},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := contentdigest.Parse(tt.in)
			if tt.wantHex == "" {
				if !errors.Is(err, errdefs.ErrInvalid) {
					t.Errorf("Parse = %q, %v; want ErrInvalid", got, err)
				}
				return
			}
			if err != nil || got != tt.wantHex {
				t.Errorf("Parse = %q, %v; want %q", got, err, tt.wantHex)
			}
		})
	}
}
