package bench

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/store"
)

func edgeCreate(id string) edge.CreateRequest {
	return edge.CreateRequest{ID: id, Backend: api.BackendContainer, Layers: []string{benchBase},
		Resources: api.Resources{CPU: 1, MemoryMB: 512}, Network: api.Network{Mode: api.NetworkNone}}
}

// clusterRun is the whole benchmark against one store.
func clusterRun(ctx context.Context, cfg ClusterConfig, kind string, perSandbox int64) error {
	dir, err := os.MkdirTemp(cfg.WorkDir, "dsec-bench-cluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// A private PostgreSQL runs as its own user: it must reach its dir.
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	heap0 := heapInuse()
	env, err := newClusterEnv(ctx, cfg, kind, dir)
	if err != nil {
		return err
	}
	defer env.stop()
	w := cfg.Out
	fmt.Fprintf(w, "\n== store: %s\n", kind)
	row := func(name string, r loadResult) {
		fmt.Fprintf(w, "%-58s %10.0f/s %9s %9s  (%d ok, %d errors)\n", name, r.rate(), ms(r.lat.p50), ms(r.lat.p99), r.n, r.errs)
	}
	fmt.Fprintf(w, "%-58s %12s %9s %9s\n", "measure", "rate", "p50", "p99")

	// Baselines, same run: the HTTP stack doing nothing, and the store
	// doing a create's two writes with nothing in front of it.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency * 2}}
	health, err := hammer(ctx, cfg.Concurrency, 3*time.Second, func() (string, error) {
		resp, err := hc.Get(env.url + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return "", err
	})
	if err != nil {
		return fmt.Errorf("healthz baseline: %w", err)
	}
	row("baseline: GET /healthz (HTTP stack, no work)", health)
	var seq atomic.Int64
	storeOnly, err := hammer(ctx, cfg.Concurrency, 3*time.Second, func() (string, error) {
		i := seq.Add(1)
		now := time.Now().UTC()
		sb := &store.Sandbox{API: api.Sandbox{ID: fmt.Sprintf("sb-store%09d", i), Backend: api.BackendContainer,
			State: api.StateCreating, Node: fmt.Sprintf("sim-%03d", i%int64(cfg.Nodes)),
			Resources: api.Resources{CPU: 1, MemoryMB: 512}, CreatedAt: now}, Tenant: env.tenant, LastActive: now}
		if err := env.st.PlaceSandboxes(ctx, []*store.Sandbox{sb}); err != nil {
			return "", err
		}
		sb.API.State = api.StateRunning
		return sb.API.ID, env.st.UpdateSandbox(ctx, sb)
	})
	if err != nil {
		return fmt.Errorf("store baseline: %w", err)
	}
	row("baseline: store alone (place + mark running)", storeOnly)

	cpu0, db0 := cpuTime(), env.dbCPU()
	creates, err := hammer(ctx, cfg.Concurrency, cfg.Duration, func() (string, error) {
		sb, err := env.client.CreateSandbox(ctx, simRequest())
		if err != nil {
			return "", err
		}
		return sb.ID, nil
	})
	if err != nil {
		return fmt.Errorf("creates: %w", err)
	}
	cpu, db := cpuTime()-cpu0, env.dbCPU()-db0
	row(fmt.Sprintf("POST /v1/sandboxes, %d nodes, %d clients", cfg.Nodes, cfg.Concurrency), creates)
	perCreate := (cpu + db) / time.Duration(max(creates.n, 1))
	what := "this whole process: API clients, control plane, simulated nodes, SQLite"
	if db > 0 {
		what = fmt.Sprintf("this whole process: API clients, control plane, simulated nodes; plus PostgreSQL's processes, %s of it",
			(db / time.Duration(max(creates.n, 1))).Round(time.Microsecond))
	}
	fmt.Fprintf(w, "  CPU per create (%s): %s; got %.2f of the host's %d cores while it ran (the host is shared); "+
		"at %d cores to itself: ~%.0f creates/s\n", what, perCreate.Round(time.Microsecond), (cpu+db).Seconds()/creates.wall.Seconds(),
		runtime.NumCPU(), runtime.NumCPU(), float64(runtime.NumCPU())/perCreate.Seconds())
	fmt.Fprintf(w, "  creates/s vs the HTTP stack doing nothing: %.2f×; vs the store alone: %.2f×\n",
		creates.rate()/health.rate(), creates.rate()/storeOnly.rate())
	ids := creates.ids
	live := int(storeOnly.n + creates.n)

	// A batch goes through the HTTP API (POST /v1/sandboxes:batch); the
	// placement is "all placed" when the last placement is charged, the
	// batch "done" when every sandbox is built on its node and running.
	batch := func(n int) (*api.BatchResult, time.Duration, time.Duration, error) {
		t0 := time.Now()
		var placedAt time.Duration
		res, err := env.client.CreateBatch(ctx, &api.BatchCreateRequest{Count: n, CreateSandboxRequest: *simRequest()},
			func(p api.BatchProgress) {
				if placedAt == 0 && p.Placed+p.Failed >= n {
					placedAt = time.Since(t0)
				}
			})
		return res, placedAt, time.Since(t0), err
	}
	res, placedAt, batchWall, err := batch(cfg.Batch)
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	ok, firstErr := 0, ""
	for _, it := range res.Items {
		if it.Error != nil {
			if firstErr == "" {
				firstErr = it.Error.Message
			}
			continue
		}
		ok++
		ids = append(ids, it.ID)
	}
	live += ok
	fmt.Fprintf(w, "one batch of %d through POST /v1/sandboxes:batch: all placed (charged in the store) after %s, "+
		"%d running after %s (%.0f/s)", cfg.Batch, placedAt.Round(time.Millisecond), ok, batchWall.Round(time.Millisecond),
		float64(ok)/batchWall.Seconds())
	if firstErr != "" {
		fmt.Fprintf(w, "; first error: %s", firstErr)
	}
	fmt.Fprintln(w)

	t0 := time.Now()
	filled := live
	for live < cfg.Live {
		res, _, _, err := batch(min(api.MaxBatchCount, cfg.Live-live))
		if err != nil {
			return fmt.Errorf("fill: %w", err)
		}
		if res.Created == 0 {
			return fmt.Errorf("fill: the cluster takes no more sandboxes at %d live", live)
		}
		live += res.Created
	}
	if live > filled {
		fmt.Fprintf(w, "filled from %d to %d live sandboxes in batches in %s\n", filled, live, time.Since(t0).Round(time.Second))
	}

	return readsAtScale(ctx, cfg, env, dir, ids, live, heap0, perSandbox)
}

// readsAtScale times reads with the cluster full and reports memory.
func readsAtScale(ctx context.Context, cfg ClusterConfig, env *clusterEnv, dir string, ids []string, live int,
	heap0, perSandbox int64) error {
	w := cfg.Out
	if len(ids) == 0 {
		return fmt.Errorf("no sandbox ids to read")
	}
	var lats []time.Duration
	for range 2000 {
		id := ids[rand.IntN(len(ids))]
		t0 := time.Now()
		if _, err := env.client.GetSandbox(ctx, id); err != nil {
			return fmt.Errorf("get %s: %w", id, err)
		}
		lats = append(lats, time.Since(t0))
	}
	get := summarize(lats)
	fmt.Fprintf(w, "%-58s %12s %9s %9s\n", fmt.Sprintf("GET /v1/sandboxes/{id}, %d live, one client", live), "", ms(get.p50), ms(get.p99))
	gets, err := hammer(ctx, cfg.Concurrency, 3*time.Second, func() (string, error) {
		_, err := env.client.GetSandbox(ctx, ids[rand.IntN(len(ids))])
		return "", err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%-58s %10.0f/s %9s %9s\n", fmt.Sprintf("GET /v1/sandboxes/{id}, %d clients", cfg.Concurrency), gets.rate(), ms(gets.lat.p50), ms(gets.lat.p99))
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	for _, l := range []struct {
		name  string
		token string
	}{
		{"first page", ""},
		{"a page in the middle", base64.RawURLEncoding.EncodeToString([]byte(sorted[len(sorted)/2]))},
	} {
		var lats []time.Duration
		for range 200 {
			t0 := time.Now()
			page, err := env.client.ListSandboxes(ctx, client.ListOptions{Limit: 100, PageToken: l.token})
			if err != nil {
				return fmt.Errorf("list: %w", err)
			}
			if len(page.Sandboxes) != 100 {
				return fmt.Errorf("list %s: %d sandboxes, want 100", l.name, len(page.Sandboxes))
			}
			lats = append(lats, time.Since(t0))
		}
		s := summarize(lats)
		fmt.Fprintf(w, "%-58s %12s %9s %9s\n", fmt.Sprintf("GET /v1/sandboxes?limit=100, %s, %d live", l.name, live), "", ms(s.p50), ms(s.p99))
	}
	if err := dashboardReads(ctx, cfg, env, live); err != nil {
		return err
	}
	heap := heapInuse() - heap0
	simHeap := perSandbox * int64(live)
	own := "≈0 (within the calibration's noise)"
	if d := heap - simHeap; d > 16<<20 {
		own = fmt.Sprintf("~%s (%d bytes/sandbox)", mib(d), d/int64(live))
	}
	fmt.Fprintf(w, "memory at %d live: Go heap grew %s, of which the simulated nodes' sandbox handles ~%s; control plane %s; "+
		"process RSS %s; database on disk %s (%s)\n", live, mib(heap), mib(simHeap), own, mib(rssBytes()), mib(dirBytes(dir)), bigFiles(dir))
	return nil
}

// dashboardReads times what the dashboard asks of a full cluster: the
// overview's calls (it makes them one after another, every 10 s) and
// paging through the whole sandbox list.
func dashboardReads(ctx context.Context, cfg ClusterConfig, env *clusterEnv, live int) error {
	w := cfg.Out
	hc := &http.Client{}
	get := func(path string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, env.url+path, nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+env.adminKey)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		n, _ := io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return int(n), nil
	}
	calls := []string{"/v1/nodes", "/v1/stats", "/v1/sandboxes:count?all_tenants=1"}
	per := make([][]time.Duration, len(calls))
	var total []time.Duration
	sizes := make([]int, len(calls))
	for range 50 {
		t0 := time.Now()
		for i, c := range calls {
			t1 := time.Now()
			n, err := get(c)
			if err != nil {
				return fmt.Errorf("dashboard overview: %w", err)
			}
			per[i] = append(per[i], time.Since(t1))
			sizes[i] = n
		}
		total = append(total, time.Since(t0))
	}
	for i, c := range calls {
		s := summarize(per[i])
		fmt.Fprintf(w, "%-58s %12s %9s %9s\n", fmt.Sprintf("dashboard: GET %s (%d KiB)", c, sizes[i]>>10), "", ms(s.p50), ms(s.p99))
	}
	s := summarize(total)
	fmt.Fprintf(w, "%-58s %12s %9s %9s\n", fmt.Sprintf("dashboard: the overview's %d calls in turn, %d live", len(calls), live), "", ms(s.p50), ms(s.p99))

	// The list, page by page to its end, as the Sandboxes page walks it.
	var pages []time.Duration
	tok, n := "", 0
	t0 := time.Now()
	for {
		t1 := time.Now()
		page, err := env.client.ListSandboxes(ctx, client.ListOptions{Limit: 1000, PageToken: tok})
		if err != nil {
			return fmt.Errorf("list walk: %w", err)
		}
		pages = append(pages, time.Since(t1))
		n += len(page.Sandboxes)
		if tok = page.NextPageToken; tok == "" {
			break
		}
	}
	s = summarize(pages)
	fmt.Fprintf(w, "%-58s %12s %9s %9s\n", fmt.Sprintf("dashboard: list every page, limit=1000: %d in %d pages, %s", n, len(pages),
		time.Since(t0).Round(time.Millisecond)), "", ms(s.p50), ms(s.p99))
	// What the list's default (live states) leaves out, by the counts.
	counts, err := env.client.CountSandboxes(ctx, false)
	if err != nil {
		return fmt.Errorf("count: %w", err)
	}
	fmt.Fprintf(w, "dashboard: GET /v1/sandboxes:count of the tenant: %d records, by state %v\n", counts.Total, counts.ByState)
	return nil
}
