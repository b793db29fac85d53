// Package process holds the Go types protoc-gen-go generates from
// process.proto, envd's process service as the E2B SDK speaks it
// (make e2b-proto; this file is not generated).
package process
