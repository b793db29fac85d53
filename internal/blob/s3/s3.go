// Package s3 is a blob.Store in a bucket of any S3-compatible service
// (AWS S3, MinIO, Ceph RGW, versitygw — the last is what the tests run).
// Objects are stored under an optional key prefix; ranged reads are HTTP
// range GETs. S3 PUTs are atomic, so a reader never sees half an object.
// It must never create or delete buckets: the bucket is the operator's.
package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Config says where the bucket is.
type Config struct {
	// Endpoint is the service's URL, http:// or https://, without a path.
	Endpoint string
	Bucket   string
	// Prefix, if set, is prepended (with a '/') to every key.
	Prefix    string
	AccessKey string
	SecretKey string
	// Region is "us-east-1" by default.
	Region string
}

// Store is a blob.Store in an S3 bucket.
type Store struct {
	core   minio.Core
	bucket string
	prefix string
}

var _ blob.Store = (*Store)(nil)

// ParseURL reads a store location of the form
// s3://ACCESS:SECRET@HOST:PORT/BUCKET[/PREFIX][?tls=1&region=R].
func ParseURL(s string) (Config, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return Config{}, errdefs.Invalid("store %q: want s3://ACCESS:SECRET@HOST:PORT/BUCKET[/PREFIX]", s)
	}
	bucket, prefix, _ := strings.Cut(strings.Trim(u.Path, "/"), "/")
	if bucket == "" {
		return Config{}, errdefs.Invalid("store %q: no bucket", s)
	}
	scheme := "http"
	if u.Query().Get("tls") == "1" {
		scheme = "https"
	}
	secret, _ := u.User.Password()
	return Config{
		Endpoint: scheme + "://" + u.Host, Bucket: bucket, Prefix: prefix,
		AccessKey: u.User.Username(), SecretKey: secret, Region: u.Query().Get("region"),
	}, nil
}

// Open connects to the bucket and checks that it exists.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errdefs.Invalid("s3 endpoint %q: want http(s)://host:port", cfg.Endpoint)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// blobfs fetches many chunks at once from one endpoint.
	tr.MaxIdleConnsPerHost = 64
	c, err := minio.New(u.Host, &minio.Options{
		Creds:     credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:    u.Scheme == "https",
		Region:    cfg.Region,
		Transport: tr,
	})
	if err != nil {
		return nil, fmt.Errorf("open s3 store: %w", err)
	}
	ok, err := c.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("open s3 store: bucket %s: %w: %w", cfg.Bucket, err, errdefs.ErrUnavailable)
	}
	if !ok {
		return nil, errdefs.NotFound("s3 bucket %s", cfg.Bucket)
	}
	p := strings.Trim(cfg.Prefix, "/")
	if p != "" {
		p += "/"
	}
	return &Store{core: minio.Core{Client: c}, bucket: cfg.Bucket, prefix: p}, nil
}

func (s *Store) name(key string) (string, error) {
	if err := blob.CheckKey(key); err != nil {
		return "", err
	}
	return s.prefix + key, nil
}

// classify maps an S3 error to an errdefs class.
func classify(key string, err error) error {
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.Code == minio.NoSuchKey || resp.StatusCode == http.StatusNotFound:
		return errdefs.NotFound("object %s", key)
	case resp.Code == "InvalidRange":
		return errdefs.Invalid("object %s: range not satisfiable", key)
	case resp.StatusCode >= 500 || resp.StatusCode == 0:
		return fmt.Errorf("object %s: %w: %w", key, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("object %s: %w", key, err)
}

// Put implements blob.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	name, err := s.name(key)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if size < 0 {
		return fmt.Errorf("put %s: %w", key, errdefs.Invalid("negative size %d", size))
	}
	sr := &exactReader{r: r, left: size, size: size}
	_, err = s.core.Client.PutObject(ctx, s.bucket, name, sr, size, minio.PutObjectOptions{
		ContentType: "application/octet-stream",
		// One part up to 64 MiB: chunks and manifests are far smaller.
		PartSize: 64 << 20,
	})
	if sr.err != nil {
		return fmt.Errorf("put %s: %w", key, sr.err)
	}
	if err != nil {
		return fmt.Errorf("put %s: %w", key, classify(key, err))
	}
	return nil
}

// exactReader fails the upload, before its last byte is sent, if r holds
// fewer or more than the promised bytes.
type exactReader struct {
	r    io.Reader
	left int64
	size int64
	err  error
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	if e.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	switch {
	case e.left == 0:
		var probe [1]byte
		if m, _ := io.ReadFull(e.r, probe[:]); m > 0 {
			e.err = errdefs.Invalid("more bytes than the %d promised", e.size)
			return 0, e.err
		}
		return n, nil
	case errors.Is(err, io.EOF):
		e.err = errdefs.Invalid("%d bytes short", e.left)
		return n, e.err
	}
	return n, err
}

// Get implements blob.Store.
func (s *Store) Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	name, err := s.name(key)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if off < 0 {
		return nil, errdefs.Invalid("object %s: negative offset", key)
	}
	if length == 0 || (length < 0 && off > 0) {
		// HTTP cannot ask for zero bytes, nor tell an empty tail from a
		// range past the end: look at the size first.
		info, err := s.Stat(ctx, key)
		if err != nil {
			return nil, err
		}
		n, err := blob.CheckRange(key, info.Size, off, length)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return io.NopCloser(strings.NewReader("")), nil
		}
		length = n
	}
	var opts minio.GetObjectOptions
	if length > 0 {
		if err := opts.SetRange(off, off+length-1); err != nil {
			return nil, errdefs.Invalid("object %s: %v", key, err)
		}
	}
	rc, info, _, err := s.core.GetObject(ctx, s.bucket, name, opts)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, classify(key, err))
	}
	if length > 0 && info.Size != length {
		// A server may answer a range beyond the end with what it has.
		rc.Close()
		return nil, errdefs.Invalid("object %s: range %d+%d past its end", key, off, length)
	}
	want := length
	if want < 0 {
		want = info.Size
	}
	return &countedReader{rc: rc, want: want}, nil
}

// countedReader turns an early end of the body into an error.
type countedReader struct {
	rc   io.ReadCloser
	want int64
	got  int64
}

func (c *countedReader) Read(p []byte) (int, error) {
	n, err := c.rc.Read(p)
	c.got += int64(n)
	if errors.Is(err, io.EOF) && c.got < c.want {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

func (c *countedReader) Close() error { return c.rc.Close() }

// Stat implements blob.Store.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	name, err := s.name(key)
	if err != nil {
		return blob.Info{}, fmt.Errorf("stat %s: %w", key, err)
	}
	info, err := s.core.Client.StatObject(ctx, s.bucket, name, minio.StatObjectOptions{})
	if err != nil {
		return blob.Info{}, fmt.Errorf("stat %s: %w", key, classify(key, err))
	}
	return blob.Info{Key: key, Size: info.Size}, nil
}

// Delete implements blob.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	name, err := s.name(key)
	if err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	err = s.core.Client.RemoveObject(ctx, s.bucket, name, minio.RemoveObjectOptions{})
	if err != nil && !errors.Is(classify(key, err), errdefs.ErrNotFound) {
		return fmt.Errorf("delete %s: %w", key, classify(key, err))
	}
	return nil
}

// List implements blob.Store.
func (s *Store) List(ctx context.Context, prefix string, fn func(blob.Info) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing goroutine if fn fails
	for obj := range s.core.Client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{
		Prefix: s.prefix + prefix, Recursive: true,
	}) {
		if obj.Err != nil {
			return fmt.Errorf("list %q: %w", prefix, classify(prefix, obj.Err))
		}
		key := strings.TrimPrefix(obj.Key, s.prefix)
		if blob.CheckKey(key) != nil {
			continue
		}
		if err := fn(blob.Info{Key: key, Size: obj.Size}); err != nil {
			return err
		}
	}
	return nil
}
