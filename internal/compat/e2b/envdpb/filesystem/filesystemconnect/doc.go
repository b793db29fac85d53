// Package filesystemconnect holds the connect-go client and handler
// protoc-gen-connect-go generates for envd's filesystem service (make
// e2b-proto; this file is not generated).
package filesystemconnect
