// Package api holds the types of dsec's public HTTP API: the JSON bodies of
// requests and responses and the error codes. The server, the edge, the
// in-sandbox agent and the Go client all speak these types; nothing here
// does I/O or imports another dsec package.
//
// The contract is documented in docs/api.md and api/openapi.yaml; a change
// to a field's meaning here needs a version bump there.
package api
