// Command lampyr-helper is PID 1 of every fiber of fiberd's process backend.
// It is started by fiberd only; see lampyr.dev/serving/impl/fiberd/helper.
//
// `lampyr-helper spawner` is the small process fiberd starts once and asks
// to clone each fiber's helper (see helper.SpawnerMain).
//
// `lampyr-helper install PATH` copies the binary to PATH: the Home's init
// container uses it to hand the helper from the helper image to fiberd.
package main

import (
	"fmt"
	"io"
	"os"

	"lampyr.dev/serving/impl/fiberd/helper"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "install" {
		if err := install(os.Args[2]); err != nil {
			fmt.Fprintf(os.Stderr, "lampyr-helper install: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) == 2 && os.Args[1] == helper.SpawnerArg {
		os.Exit(helper.SpawnerMain())
	}
	os.Exit(helper.Main())
}

func install(dst string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	in, err := os.Open(self)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
