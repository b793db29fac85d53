package edge

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
)

// loadMeter measures the node's load: CPU from /proc/stat and sandbox CPU
// from the backends' cgroup counters, both as rates since the previous
// measurement; memory as it is now.
type loadMeter struct {
	mu          sync.Mutex
	at          time.Time
	busy, total uint64  // jiffies from /proc/stat
	sandboxCPU  float64 // cumulative seconds
	last        api.NodeLoad
}

// measure returns the load since the previous call (the first call
// reports CPU as zero). Calls closer than a second apart get the previous
// figure.
func (m *loadMeter) measure(ctx context.Context, backends []backend.Backend) api.NodeLoad {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if !m.at.IsZero() && now.Sub(m.at) < time.Second {
		return m.last
	}
	var l api.NodeLoad
	busy, total, ok := procStat()
	if ok && m.total > 0 && total > m.total {
		l.CPU = float64(busy-m.busy) / float64(total-m.total) * float64(runtime.NumCPU())
	}
	var sbCPU float64
	for _, b := range backends {
		if p, ok := b.(blankPooler); ok {
			if st := p.PoolStats(); st.Max > 0 {
				l.BlankPool = &st
			}
		}
		if ur, ok := b.(backend.UsageReporter); ok {
			if u, err := ur.Usage(ctx); err == nil {
				sbCPU += u.CPUSeconds
				l.SandboxMemoryMB += u.MemoryBytes >> 20
			}
		}
	}
	if !m.at.IsZero() && sbCPU >= m.sandboxCPU {
		l.SandboxCPU = (sbCPU - m.sandboxCPU) / now.Sub(m.at).Seconds()
	}
	l.MemoryMB = usedMemoryMB()
	m.at, m.busy, m.total, m.sandboxCPU, m.last = now, busy, total, sbCPU, l
	return l
}

// blankPooler is a backend with a pool of blank sandboxes (the container
// backend's --container-pool).
type blankPooler interface {
	PoolStats() api.BlankPool
}

// procStat reads the busy and total jiffies of all CPUs.
func procStat() (busy, total uint64, ok bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0, false
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, false
	}
	for i, s := range fields[1:] {
		v, _ := strconv.ParseUint(s, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, true
}

// usedMemoryMB is MemTotal - MemAvailable: what the node uses and cannot
// get back by dropping caches.
func usedMemoryMB() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	var totalKB, availKB int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "MemTotal:":
			totalKB = v
		case "MemAvailable:":
			availKB = v
		}
	}
	return (totalKB - availKB) >> 10
}
