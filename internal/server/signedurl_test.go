package server

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// A signed URL's token opens the one route of the one sandbox it was made
// for, for its tenant, until it expires; any change to it is refused.
func TestSignedRoute(t *testing.T) {
	s := &Server{urlKey: []byte("0123456789abcdef0123456789abcdef")}
	exp := time.Now().Add(time.Minute)
	tok := s.signRoute("terminal", "sb-1", "t-1", exp)
	p, err := s.verifyRoute(tok, "terminal", "sb-1")
	if err != nil || p.Tenant != "t-1" || p.Admin {
		t.Fatalf("verify = %+v, %v; want tenant t-1, not admin", p, err)
	}
	head, sig, _ := strings.Cut(tok, ".")
	otherTenant := s.signRoute("terminal", "sb-1", "t-2", exp)
	otherHead, _, _ := strings.Cut(otherTenant, ".")
	flipped := []byte(sig)
	flipped[3] ^= 1
	refused := map[string]struct{ tok, route, sandbox string }{
		"another sandbox":          {tok, "terminal", "sb-2"},
		"another route":            {tok, "vnc", "sb-1"},
		"a port route":             {tok, portRoute(8080), "sb-1"},
		"a tampered signature":     {head + "." + string(flipped), "terminal", "sb-1"},
		"claims of another tenant": {otherHead + "." + sig, "terminal", "sb-1"},
		"expired":                  {s.signRoute("terminal", "sb-1", "t-1", time.Now().Add(-time.Second)), "terminal", "sb-1"},
		"another server's key":     {(&Server{urlKey: []byte("another key, as long as the first")}).signRoute("terminal", "sb-1", "t-1", exp), "terminal", "sb-1"},
		"no signature":             {head, "terminal", "sb-1"},
		"garbage":                  {"!!.??", "terminal", "sb-1"},
		"empty":                    {"", "terminal", "sb-1"},
	}
	for name, c := range refused {
		if _, err := s.verifyRoute(c.tok, c.route, c.sandbox); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("%s: verify = %v, want unauthenticated", name, err)
		}
	}
	// Port URLs share the function, bound to their port.
	ptok := s.signRoute(portRoute(8080), "sb-1", "t-1", exp)
	if _, err := s.verifyRoute(ptok, portRoute(8081), "sb-1"); err == nil {
		t.Error("a port token opens another port")
	}
	if _, err := s.verifyRoute(ptok, portRoute(8080), "sb-1"); err != nil {
		t.Errorf("a port token: %v", err)
	}
}
