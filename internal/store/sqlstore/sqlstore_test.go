package sqlstore

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

var testDialect = Dialect{
	StateIn: func(states []string) (string, []any) { return "state IN (list)", []any{states} },
	Label:   func(k, v string) (string, []any) { return "label(" + k + ") = ?", []any{v} },
}

func TestListQuery(t *testing.T) {
	at := time.Unix(0, 42)
	tests := []struct {
		name    string
		f       store.SandboxFilter
		where   string // the query's text from WHERE on
		args    int
		invalid bool
	}{
		{name: "tenant", f: store.SandboxFilter{Tenant: "t"}, where: " WHERE tenant = ? ORDER BY id", args: 1},
		{name: "all tenants, limit", f: store.SandboxFilter{AllTenants: true, Limit: 10}, where: " ORDER BY id LIMIT 11"},
		{name: "every condition", f: store.SandboxFilter{Tenant: "t", Node: "n", States: []string{"running"},
			Labels: map[string]string{"k": "v"}, ExpiredBy: &at, IdleBy: &at, PageToken: "YQ"},
			where: " WHERE tenant = ? AND node = ? AND state IN (list) AND label(k) = ? AND expires_at IS NOT NULL AND expires_at <= ?" +
				" AND idle_timeout > 0 AND (last_active + idle_timeout) <= ? AND id > ? ORDER BY id", args: 7},
		{name: "bad label key", f: store.SandboxFilter{Tenant: "t", Labels: map[string]string{"k'": "v"}}, invalid: true},
		{name: "bad page token", f: store.SandboxFilter{Tenant: "t", PageToken: "!"}, invalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, args, err := ListQuery(tt.f, testDialect)
			if tt.invalid {
				if !errors.Is(err, errdefs.ErrInvalid) {
					t.Fatalf("err = %v, want invalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := `SELECT ` + SandboxCols + ` FROM sandboxes` + tt.where; q != want {
				t.Errorf("query\n%s\nwant\n%s", q, want)
			}
			if len(args) != tt.args || strings.Count(q, "?") != len(args)-len(tt.f.States) {
				t.Errorf("%d args for %d placeholders, want %d", len(args), strings.Count(q, "?"), tt.args)
			}
		})
	}
}

func TestPage(t *testing.T) {
	sbs := make([]store.Sandbox, 3)
	for i, id := range []string{"a", "b", "c"} {
		sbs[i].API.ID = id
	}
	if out, next := Page(sbs, 0); len(out) != 3 || next != "" {
		t.Errorf("no limit: %d, %q", len(out), next)
	}
	if out, next := Page(sbs, 3); len(out) != 3 || next != "" {
		t.Errorf("last page: %d, %q", len(out), next)
	}
	out, next := Page(sbs, 2)
	if len(out) != 2 || next == "" {
		t.Fatalf("first page: %d, %q", len(out), next)
	}
	q, args, err := ListQuery(store.SandboxFilter{AllTenants: true, PageToken: next}, testDialect)
	if err != nil || !strings.Contains(q, "id > ?") || args[0] != "b" {
		t.Errorf("next page: %s %v %v", q, args, err)
	}
}

func TestUpdate(t *testing.T) {
	res := api.Resources{CPU: 1, MemoryMB: 512, Pids: 64}
	booked := store.Charge{MilliCPU: 500, MemoryMB: 256, Pids: 32, Sandboxes: 1}
	record := func(deleted bool) *store.Sandbox {
		sb := &store.Sandbox{Tenant: "t", Version: 3}
		sb.API.ID, sb.API.Node, sb.API.Resources = "sb", "n1", res
		if deleted {
			now := time.Now()
			sb.DeletedAt = &now
		}
		return sb
	}
	tests := []struct {
		name        string
		sb          *store.Sandbox
		st          Stored
		err         error
		release     bool
		charged     int
		chargedMCPU int64
	}{
		{name: "stale version", sb: record(false), st: Stored{Version: 2}, err: store.ErrConflict},
		{name: "charged record changes node", sb: record(false),
			st: Stored{Version: 3, Charged: true, Node: "n2", Tenant: "t"}, err: errdefs.ErrInvalid},
		{name: "charged record keeps the booked charge", sb: record(false),
			st: Stored{Version: 3, Charged: true, Node: "n1", Tenant: "t", Charge: booked}, charged: 1, chargedMCPU: 500},
		{name: "ending a charged record releases it", sb: record(true),
			st: Stored{Version: 3, Charged: true, Node: "n1", Tenant: "t", Charge: booked}, release: true, chargedMCPU: 500},
		{name: "uncharged record", sb: record(true), st: Stored{Version: 3}, chargedMCPU: 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args, err := SandboxArgs(tt.sb)
			if err != nil {
				t.Fatal(err)
			}
			upd, release, err := Update(tt.sb, args, tt.st)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if release != tt.release {
				t.Errorf("release = %v", release)
			}
			// SandboxUpdate: 12 columns, charged, id, version.
			if len(upd) != 15 || upd[12] != tt.charged || upd[13] != "sb" || upd[14] != int64(3) {
				t.Errorf("update args %v", upd)
			}
			if upd[7] != tt.chargedMCPU {
				t.Errorf("mcpu = %v, want %d", upd[7], tt.chargedMCPU)
			}
		})
	}
}
