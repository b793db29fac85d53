package blobfs

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// metrics are blobfs's Prometheus series, in a registry of its own.
type metrics struct {
	reg           *prometheus.Registry
	readBytes     prometheus.Counter
	fetchedBytes  prometheus.Counter
	fetchedChunks prometheus.Counter
	fetchedRaw    prometheus.Counter
	hits          prometheus.Counter
	misses        prometheus.Counter
	evictions     prometheus.Counter
	fetchErrors   prometheus.Counter
	readErrors    prometheus.Counter
	prefetched    prometheus.Counter
	cacheBytes    prometheus.Gauge
	fetchSeconds  prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		readBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "dsec_blobfs_read_bytes_total",
			Help: "Bytes read from blobfs files by the kernel."}),
		fetchedBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "dsec_blobfs_fetched_bytes_total",
			Help: "Bytes fetched from the layer store (compressed)."}),
		fetchedRaw: prometheus.NewCounter(prometheus.CounterOpts{Name: "dsec_blobfs_fetched_raw_bytes_total",
			Help: "Uncompressed bytes of the chunks fetched from the layer store."}),
		fetchedChunks: prometheus.NewCounter(prometheus.CounterOpts{Name: "dsec_blobfs_fetched_chunks_total",
			Help: "Chunks fetched from the layer store."}),
		hits: prometheus.NewCounter(prometheus.CounterOpts{Name: "dsec_blobfs_cache_hits_total",
			Help: "Chunk reads served from the node cache."}),
		misses: prometheus.NewCounter(prometheus.CounterOpts{Name: "dsec_blobfs_cache_misses_total",
			Help: "Chunk reads that had to fetch (merged fetches count once)."}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{Name: "dsec_blobfs_cache_evictions_total",
			Help: "Chunks evicted to keep the cache under its cap."}),
		fetchErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "dsec_blobfs_fetch_errors_total",
			Help: "Chunk fetches that failed (store error or digest mismatch)."}),
		readErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "dsec_blobfs_read_errors_total",
			Help: "Reads answered with EIO."}),
		prefetched: prometheus.NewCounter(prometheus.CounterOpts{Name: "dsec_blobfs_prefetched_chunks_total",
			Help: "Chunks fetched ahead of use from layers' hot lists."}),
		cacheBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dsec_blobfs_cache_bytes",
			Help: "Bytes held by the node chunk cache."}),
		fetchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dsec_blobfs_fetch_seconds",
			Help: "Latency of one chunk fetch from the layer store.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
	m.reg.MustRegister(m.readBytes, m.fetchedBytes, m.fetchedRaw, m.fetchedChunks, m.hits, m.misses, m.evictions,
		m.fetchErrors, m.readErrors, m.prefetched, m.cacheBytes, m.fetchSeconds)
	return m
}

func (m *metrics) startFetch() func() {
	t0 := time.Now()
	return func() { m.fetchSeconds.Observe(time.Since(t0).Seconds()) }
}

// Stats is a summary of the counters.
type Stats struct {
	ReadBytes     int64 `json:"read_bytes"`
	FetchedBytes  int64 `json:"fetched_bytes"`
	FetchedRaw    int64 `json:"fetched_raw_bytes"`
	FetchedChunks int64 `json:"fetched_chunks"`
	CacheHits     int64 `json:"cache_hits"`
	CacheMisses   int64 `json:"cache_misses"`
	Evictions     int64 `json:"evictions"`
	FetchErrors   int64 `json:"fetch_errors"`
	ReadErrors    int64 `json:"read_errors"`
	Prefetched    int64 `json:"prefetched_chunks"`
	CacheBytes    int64 `json:"cache_bytes"`
}

func (m *metrics) stats() Stats {
	v := func(c prometheus.Collector) int64 {
		mfs := make(chan prometheus.Metric, 1)
		c.Collect(mfs)
		close(mfs)
		for x := range mfs {
			var pb dto.Metric
			x.Write(&pb)
			switch {
			case pb.Counter != nil:
				return int64(pb.Counter.GetValue())
			case pb.Gauge != nil:
				return int64(pb.Gauge.GetValue())
			}
		}
		return 0
	}
	return Stats{
		ReadBytes: v(m.readBytes), FetchedBytes: v(m.fetchedBytes), FetchedRaw: v(m.fetchedRaw), FetchedChunks: v(m.fetchedChunks),
		CacheHits: v(m.hits), CacheMisses: v(m.misses), Evictions: v(m.evictions),
		FetchErrors: v(m.fetchErrors), ReadErrors: v(m.readErrors), Prefetched: v(m.prefetched),
		CacheBytes: v(m.cacheBytes),
	}
}
