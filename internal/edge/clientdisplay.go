package edge

import (
	"context"
	"net/http"
	"net/http/httputil"

	"github.com/dsec-project/dsec/api"
)

// ProxySandbox passes a request on to the edge's route path of a sandbox
// (/screen, /input, /vnc), answer and WebSocket upgrades included.
func (c *Client) ProxySandbox(w http.ResponseWriter, r *http.Request, id, path string) {
	r2 := r.Clone(r.Context())
	target := c.base + "/v1/sandboxes/" + id + path
	rp := *c.proxy
	rp.Rewrite = func(pr *httputil.ProxyRequest) {
		u := *pr.Out.URL
		t, _ := http.NewRequest(http.MethodGet, target, nil)
		u.Scheme, u.Host, u.Path, u.RawPath = t.URL.Scheme, t.URL.Host, t.URL.Path, ""
		pr.Out.URL = &u
		pr.Out.Host = t.URL.Host
		pr.Out.Header.Del("Authorization")
		if c.token != "" {
			pr.Out.Header.Set("Authorization", "Bearer "+c.token)
		}
	}
	serveDuplex(&rp, w, r2)
}

// Display returns the size of a sandbox's screen.
func (c *Client) Display(ctx context.Context, id string) (api.Display, error) {
	var d api.Display
	return d, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+id+"/display", nil, &d)
}
