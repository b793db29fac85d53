package server

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/httpapi"
)

// wsURLTTL is how long a signed terminal or VNC URL may be opened: long
// enough for a browser to open it at once, too short to be worth leaking.
// An open WebSocket lives on after it: the token is checked at the
// handshake only.
const wsURLTTL = time.Minute

// wsURL answers POST /v1/sandboxes/{id}/{route}/url (route "terminal" or
// "vnc") with a signed one-minute ws:// URL of that WebSocket route. A
// browser cannot set a header on a WebSocket, so its page asks for one of
// these with its key and opens the URL.
func (s *Server) wsURL(route string) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		sb, err := s.sandboxFor(r.Context(), r.PathValue("id"))
		if err != nil {
			return err
		}
		exp := time.Now().Add(wsURLTTL).Truncate(time.Second)
		tok := s.signRoute(route, sb.API.ID, principalFrom(r.Context()).Tenant, exp)
		scheme := "ws"
		if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
			scheme = "wss"
		}
		u := fmt.Sprintf("%s://%s/v1/sandboxes/%s/%s?token=%s", scheme, r.Host, url.PathEscape(sb.API.ID), route, tok)
		httpapi.WriteJSON(w, http.StatusOK, api.SignedURL{URL: u, Token: tok, ExpiresAt: exp.UTC()})
		return nil
	}
}

// keyOrToken authenticates a WebSocket route by an API key or, without
// one, by the `token` query parameter of a URL wsURL signed for that
// route and sandbox; the token is taken out of the query before the
// request goes on.
func (s *Server) keyOrToken(route string, h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	keyed := s.authenticated(h, false)
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if !q.Has("token") || r.Header.Get("Authorization") != "" {
			keyed(w, r)
			return
		}
		p, err := s.verifyRoute(q.Get("token"), route, r.PathValue("id"))
		if err == nil {
			q.Del("token")
			r.URL.RawQuery = q.Encode()
			r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
			err = h(w, r)
		}
		if err != nil {
			httpapi.WriteError(w, r, err)
		}
	}
}
