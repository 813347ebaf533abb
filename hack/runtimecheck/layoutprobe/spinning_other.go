//go:build !amd64

package main

// gVisor reaches runtime.sched only on amd64.
func printSpinning() {}
