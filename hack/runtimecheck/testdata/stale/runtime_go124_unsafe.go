//go:build go1.24

// Test data for TestInspectFindsAStaleCopy; never built.
package sync

import "unsafe"

const maptypeHasherOffset = unsafe.Offsetof(maptype{}.Hasher) // +checkoffset internal/abi SwissMapType.Hasher
