// Command lampyr-helper is PID 1 of every fiber of fiberd's process backend.
// It is started by fiberd only; see lampyr.dev/serving/impl/fiberd/helper.
package main

import (
	"os"

	"lampyr.dev/serving/impl/fiberd/helper"
)

func main() { os.Exit(helper.Main()) }
