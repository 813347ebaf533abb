// Command layoutprobe is built by runtimecheck's tests the way a program
// is (`go build`, with DWARF; `go test` links its binaries without it) so
// that they can read what the compiler laid out. It links the packages
// that reach into the runtime's data (gVisor's pkg/sync, which fiberd
// links through gVisor's netstack) and prints the run-time addresses the
// tests need: its own anchor function (to turn link-time addresses into
// run-time ones) and gVisor's cached address of runtime.sched.nmspinning.
package main

import (
	"fmt"
	"reflect"
	"unsafe"

	gsync "gvisor.dev/gvisor/pkg/sync"
)

//go:noinline
func anchor() {}

func main() {
	fmt.Printf("anchor %d\n", reflect.ValueOf(anchor).Pointer())
	printSpinning()
	// gVisor's copy of the runtime's map type (its field Hasher must sit
	// where internal/abi.MapType's does): using it keeps the copy in this
	// binary's DWARF, and calling the hasher it finds crashes here, not in
	// fiberd, if the offset is stale.
	h := gsync.MapKeyHasher(map[uint64]bool{})
	k := uint64(42)
	if h(unsafe.Pointer(&k), 1) != h(unsafe.Pointer(&k), 1) {
		panic("gVisor's MapKeyHasher is not a hash function of this runtime")
	}
	fmt.Println("maphasher 1")
}
