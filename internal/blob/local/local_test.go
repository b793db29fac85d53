package local_test

import (
	"testing"

	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/blob/blobtest"
	"github.com/dsec-project/dsec/internal/blob/local"
)

func TestConformance(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store {
		s, err := local.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
