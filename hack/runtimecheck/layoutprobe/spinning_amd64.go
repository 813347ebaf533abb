package main

import (
	"fmt"
	"unsafe"
)

// gvisorNMSpinning is gVisor's cached address of runtime.sched.nmspinning
// (gvisor.dev/gvisor/pkg/sync, runtime_amd64.go: addrOfSpinning() is
// runtime·sched plus the NMSPINNING_OFFSET its assembly was written with;
// only amd64 has it).
//
//go:linkname gvisorNMSpinning gvisor.dev/gvisor/pkg/sync.nmspinning
var gvisorNMSpinning *int32

func printSpinning() {
	fmt.Printf("gvisor-nmspinning %d\n", uintptr(unsafe.Pointer(gvisorNMSpinning)))
}
