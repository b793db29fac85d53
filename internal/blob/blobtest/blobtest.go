// Package blobtest is the behaviour suite every blob.Store runs: whole and
// ranged reads, atomic puts, short and long writers, listing, deletes and
// concurrent use. It must never depend on one implementation's layout.
package blobtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Run runs the suite against the store newStore returns; each subtest gets
// a fresh, empty store.
func Run(t *testing.T, newStore func(t *testing.T) blob.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s blob.Store)
	}{
		{"PutGetStat", testPutGetStat},
		{"Ranges", testRanges},
		{"Missing", testMissing},
		{"BadKeys", testBadKeys},
		{"WrongSize", testWrongSize},
		{"Replace", testReplace},
		{"Delete", testDelete},
		{"List", testList},
		{"Concurrent", testConcurrent},
		{"Canceled", testCanceled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore(t)) })
	}
}

func random(t *testing.T, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func put(t *testing.T, s blob.Store, key string, data []byte) {
	t.Helper()
	if err := s.Put(context.Background(), key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("Put(%s): %v", key, err)
	}
}

func get(t *testing.T, s blob.Store, key string, off, n int64) ([]byte, error) {
	t.Helper()
	rc, err := s.Get(context.Background(), key, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func testPutGetStat(t *testing.T, s blob.Store) {
	ctx := context.Background()
	for _, size := range []int{0, 1, 4096, 1<<20 + 3} {
		key := fmt.Sprintf("chunks/sha256/obj-%d", size)
		data := random(t, size)
		put(t, s, key, data)
		got, err := get(t, s, key, 0, -1)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("Get(%s) = %d bytes, %v; want the %d put", key, len(got), err, size)
		}
		info, err := s.Stat(ctx, key)
		if err != nil || info.Size != int64(size) || info.Key != key {
			t.Fatalf("Stat(%s) = %+v, %v", key, info, err)
		}
	}
}

func testRanges(t *testing.T, s blob.Store) {
	data := random(t, 10000)
	put(t, s, "r/obj", data)
	tests := []struct {
		name    string
		off, n  int64
		wantErr error
	}{
		{"head", 0, 100, nil},
		{"middle", 4000, 2000, nil},
		{"tail", 9000, 1000, nil},
		{"to end", 9999, -1, nil},
		{"empty at end", 10000, -1, nil},
		{"zero length", 500, 0, nil},
		{"past end", 9990, 20, errdefs.ErrInvalid},
		{"offset past end", 10001, 1, errdefs.ErrInvalid},
		{"negative offset", -1, 1, errdefs.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := get(t, s, "r/obj", tc.off, tc.n)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Get(%d, %d) = %v, want %v", tc.off, tc.n, err, tc.wantErr)
				}
				return
			}
			end := int64(len(data))
			if tc.n >= 0 {
				end = tc.off + tc.n
			}
			if err != nil || !bytes.Equal(got, data[tc.off:end]) {
				t.Fatalf("Get(%d, %d) = %d bytes, %v; want %d", tc.off, tc.n, len(got), err, end-tc.off)
			}
		})
	}
}

func testMissing(t *testing.T, s blob.Store) {
	ctx := context.Background()
	if _, err := s.Get(ctx, "no/such", 0, -1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(missing) = %v, want not found", err)
	}
	if _, err := s.Get(ctx, "no/such", 0, 10); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ranged Get(missing) = %v, want not found", err)
	}
	if _, err := s.Stat(ctx, "no/such"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat(missing) = %v, want not found", err)
	}
	put(t, s, "dir/obj", []byte("x"))
	if _, err := s.Stat(ctx, "dir"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat of a key prefix = %v, want not found", err)
	}
}

func testBadKeys(t *testing.T, s blob.Store) {
	ctx := context.Background()
	for _, key := range []string{"", "/abs", "a//b", "../up", "a/../b", ".hidden", "a/.tmp/x", "UPPER", "sp ace", "a/", strings.Repeat("a", 600)} {
		if err := s.Put(ctx, key, strings.NewReader("x"), 1); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Put(%q) = %v, want invalid", key, err)
		}
		if _, err := s.Get(ctx, key, 0, -1); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Get(%q) = %v, want invalid", key, err)
		}
	}
}

func testWrongSize(t *testing.T, s blob.Store) {
	ctx := context.Background()
	tests := []struct {
		name string
		data string
		size int64
	}{
		{"short", "abc", 10},
		{"long", "abcdefghijkl", 5},
		{"negative", "abc", -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := "ws/" + tc.name
			if err := s.Put(ctx, key, strings.NewReader(tc.data), tc.size); err == nil {
				t.Fatalf("Put(%d bytes as %d) succeeded", len(tc.data), tc.size)
			}
			if _, err := s.Stat(ctx, key); !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("after a failed put, Stat = %v, want not found", err)
			}
		})
	}
	// A failing reader stores nothing either.
	r := io.MultiReader(strings.NewReader("part"), &failReader{})
	if err := s.Put(ctx, "ws/fail", r, 100); err == nil {
		t.Fatal("Put from a failing reader succeeded")
	}
	if _, err := s.Stat(ctx, "ws/fail"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after a failed put, Stat = %v, want not found", err)
	}
}

type failReader struct{}

func (failReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func testReplace(t *testing.T, s blob.Store) {
	put(t, s, "k", []byte("first"))
	put(t, s, "k", []byte("second!"))
	got, err := get(t, s, "k", 0, -1)
	if err != nil || string(got) != "second!" {
		t.Fatalf("after replace, Get = %q, %v", got, err)
	}
}

func testDelete(t *testing.T, s blob.Store) {
	ctx := context.Background()
	put(t, s, "d/obj", []byte("x"))
	for i := range 2 { // the second delete finds nothing, and succeeds
		if err := s.Delete(ctx, "d/obj"); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if _, err := s.Stat(ctx, "d/obj"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete, Stat = %v", err)
	}
}

func testList(t *testing.T, s blob.Store) {
	ctx := context.Background()
	keys := []string{"a/b/2", "a/b/1", "a/c", "a-b", "b/x", "a/b/10"}
	for i, k := range keys {
		put(t, s, k, bytes.Repeat([]byte("x"), i))
	}
	tests := []struct {
		prefix string
		want   []string
	}{
		{"a/", []string{"a/b/1", "a/b/10", "a/b/2", "a/c"}},
		{"a/b/1", []string{"a/b/1", "a/b/10"}},
		{"a", []string{"a-b", "a/b/1", "a/b/10", "a/b/2", "a/c"}},
		{"", []string{"a-b", "a/b/1", "a/b/10", "a/b/2", "a/c", "b/x"}},
		{"zz/", nil},
	}
	for _, tc := range tests {
		t.Run("prefix="+tc.prefix, func(t *testing.T) {
			var got []string
			err := s.List(ctx, tc.prefix, func(info blob.Info) error {
				got = append(got, info.Key)
				if want := int64(indexOf(keys, info.Key)); info.Size != want {
					t.Errorf("List: %s has size %d, want %d", info.Key, info.Size, want)
				}
				return nil
			})
			if err != nil || strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("List(%q) = %v, %v; want %v", tc.prefix, got, err, tc.want)
			}
		})
	}
	stop := errors.New("stop")
	n := 0
	err := s.List(ctx, "", func(blob.Info) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Fatalf("List with a failing callback = %v after %d calls, want stop after 1", err, n)
	}
}

func indexOf(list []string, v string) int {
	for i, x := range list {
		if x == v {
			return i
		}
	}
	return -1
}

// testConcurrent puts one content-addressed key from many writers while
// readers read it: a reader sees the whole object or not found, never part.
func testConcurrent(t *testing.T, s blob.Store) {
	data := random(t, 256<<10)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				if err := s.Put(context.Background(), "c/same", bytes.NewReader(data), int64(len(data))); err != nil {
					errs <- err
				}
				return
			}
			for range 5 {
				got, err := get(t, s, "c/same", 0, -1)
				if errors.Is(err, errdefs.ErrNotFound) {
					continue
				}
				if err != nil {
					errs <- err
				} else if !bytes.Equal(got, data) {
					errs <- fmt.Errorf("read %d bytes of a partial or wrong object", len(got))
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testCanceled(t *testing.T, s blob.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Put(ctx, "cx/obj", bytes.NewReader(random(t, 1<<20)), 1<<20); err == nil {
		t.Fatal("Put with a canceled context succeeded")
	}
	if _, err := s.Stat(context.Background(), "cx/obj"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after a canceled put, Stat = %v", err)
	}
}
