// Package e2e holds dsec's end-to-end tests: a real `dsec server` process
// (control plane, local edge, runc containers on EROFS layers) driven
// through the Go client and raw HTTP, exactly as users drive it. It has no
// non-test code.
package e2e
