// Package processconnect holds the connect-go client and handler
// protoc-gen-connect-go generates for envd's process service (make
// e2b-proto; this file is not generated).
package processconnect
