package s3_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/blob/blobtest"
	"github.com/dsec-project/dsec/internal/blob/s3"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestConformance runs the suite against a real S3 server; each subtest
// gets its own key prefix in one bucket.
func TestConformance(t *testing.T) {
	srv := testutil.StartS3(t)
	var n atomic.Int64
	blobtest.Run(t, func(t *testing.T) blob.Store {
		cfg, err := s3.ParseURL(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.Prefix = fmt.Sprintf("t%d", n.Add(1))
		s, err := s3.Open(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestOpenMissingBucket(t *testing.T) {
	srv := testutil.StartS3(t)
	cfg, _ := s3.ParseURL(srv.URL())
	cfg.Bucket = "nope"
	if _, err := s3.Open(context.Background(), cfg); err == nil {
		t.Fatal("Open of a missing bucket succeeded")
	}
}

func TestParseURL(t *testing.T) {
	tests := []struct {
		in      string
		want    s3.Config
		wantErr bool
	}{
		{"s3://ak:sk@127.0.0.1:9000/b", s3.Config{Endpoint: "http://127.0.0.1:9000", Bucket: "b", AccessKey: "ak", SecretKey: "sk"}, false},
		{"s3://ak:sk@h:1/b/p/q?tls=1&region=eu", s3.Config{Endpoint: "https://h:1", Bucket: "b", Prefix: "p/q", AccessKey: "ak", SecretKey: "sk", Region: "eu"}, false},
		{"s3://h:1/", s3.Config{}, true},
		{"http://h/b", s3.Config{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := s3.ParseURL(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("ParseURL = %+v, %v; want %+v (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
