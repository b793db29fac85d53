package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/blob/local"
	"github.com/dsec-project/dsec/internal/blob/posix"
	"github.com/dsec-project/dsec/internal/blob/s3"
	"github.com/dsec-project/dsec/internal/blobfs"
	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/layer"
)

// storeEnv carries the store's location to the blobfs process, so that
// S3 credentials never show on a command line.
const storeEnv = "DSEC_STORE"

// openBlobStore opens the layer store at loc: s3://ACCESS:SECRET@HOST/
// BUCKET[/PREFIX] for an S3 service, a directory on a mount shared by the
// nodes, or "" for localDir, a directory this node owns.
func openBlobStore(ctx context.Context, loc, localDir, nodeID string) (blob.Store, error) {
	switch {
	case strings.HasPrefix(loc, "s3://"):
		cfg, err := s3.ParseURL(loc)
		if err != nil {
			return nil, err
		}
		return s3.Open(ctx, cfg)
	case loc == "":
		return local.Open(localDir)
	}
	return posix.Open(loc, posix.Options{NodeID: nodeID})
}

// blobfsCmd runs the node's blobfs (started by the edge; not for people).
func blobfsCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dsec blobfs", flag.ContinueOnError)
	dir := fs.String("dir", "", "blobfs directory (mount, socket, pid file)")
	manifests := fs.String("manifests", "", "directory of the manifests of the layers to serve")
	cache := fs.String("cache", "", "chunk cache directory")
	cacheMax := fs.Int64("cache-max", 20<<30, "chunk cache cap in bytes")
	nodeID := fs.String("node-id", "", "this node's name")
	worker := fs.Bool("worker", false, "serve the FUSE fd inherited from the keeper (set by the keeper)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *manifests == "" || *cache == "" {
		return errors.New("usage: dsec blobfs --dir DIR --manifests DIR --cache DIR (store in $" + storeEnv + ")")
	}
	log := (&nodeFlags{}).logger()
	if !*worker {
		// The keeper: it holds the mount and runs the worker, again and
		// again if it dies.
		self, err := os.Executable()
		if err != nil {
			return err
		}
		// Set by the edge when the last keeper died and left its worker
		// serving: take over that worker's connection.
		adopt, _ := strconv.Atoi(os.Getenv(blobfs.AdoptEnv))
		return blobfs.Keep(ctx, *dir, append([]string{self, "blobfs"}, append(args, "--worker")...), adopt, log)
	}
	fd, err := strconv.Atoi(os.Getenv(blobfs.FDEnv))
	if err != nil {
		return fmt.Errorf("blobfs worker: no FUSE fd in $%s", blobfs.FDEnv)
	}
	loc := os.Getenv(storeEnv)
	bs, err := openBlobStore(ctx, loc, filepath.Join(*dir, "..", "..", "store"), *nodeID)
	if err != nil {
		return err
	}
	st, err := layer.NewStore(bs, filepath.Join(*dir, "tmp"))
	if err != nil {
		return err
	}
	return blobfs.Work(ctx, *dir, fd, blobfs.Config{
		ManifestDir: *manifests, CacheDir: *cache, CacheMax: *cacheMax, Source: st, Logger: log,
	})
}

// layerFlags are the node's layer settings.
type layerFlags struct {
	mode        string
	directBelow int64
	cacheMax    int64
}

func (l *layerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.mode, "layer-mode", "ondemand", "how a node gets layer data: ondemand (blobfs) or full (whole blob before mount)")
	fs.Int64Var(&l.directBelow, "layer-direct-below", 8<<20, "blobs up to this many bytes are fetched whole and mounted without blobfs")
	fs.Int64Var(&l.cacheMax, "chunk-cache-max", 20<<30, "bytes of chunks blobfs keeps on node disk")
}

func (l *layerFlags) validate() error {
	if l.mode != "ondemand" && l.mode != "full" {
		return fmt.Errorf("--layer-mode %q: want ondemand or full", l.mode)
	}
	return nil
}

// layerRecordPrefetch stores, for each layer given, the chunks this node's
// blobfs saw read (first-read order) as the layer's hot list: nodes that
// mount the layer later fetch those chunks ahead of use. Run it on a node,
// as root, after a representative first run.
func layerRecordPrefetch(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dsec layer record-prefetch", flag.ContinueOnError)
	edgeData := fs.String("edge-data", "", "the node's edge data directory (dsec server: <data>/edge; dsec edge: --data)")
	storeLoc := fs.String("store", "", "the layer store (as given to dsec server or edge; empty: <data>/store of the server whose edge data this is)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *edgeData == "" || fs.NArg() == 0 {
		return errors.New("usage: dsec layer record-prefetch --edge-data DIR [--store LOC] DIGEST [DIGEST ...]")
	}
	bs, err := openBlobStore(ctx, *storeLoc, filepath.Join(*edgeData, "..", "store"), "")
	if err != nil {
		return err
	}
	st, err := layer.NewStore(bs, filepath.Join(*edgeData, "tmp"))
	if err != nil {
		return err
	}
	for _, d := range fs.Args() {
		h, err := contentdigest.Parse(d)
		if err != nil {
			return err
		}
		hot, err := blobfs.DaemonTouched(ctx, filepath.Join(*edgeData, "blobfs"), h)
		if err != nil {
			return err
		}
		if err := st.PutPrefetch(ctx, d, hot); err != nil {
			return err
		}
		fmt.Printf("%s: %d hot chunks\n", d, len(hot))
	}
	return nil
}
