// Package filesystem holds the Go types protoc-gen-go generates from
// filesystem.proto, envd's filesystem service as the E2B SDK speaks
// it (make e2b-proto; this file is not generated).
package filesystem
