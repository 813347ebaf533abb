// Command lampyr-runc is an OCI runtime wrapper registered with dockerd on
// hosts whose capability bounding set lacks capabilities that privileged
// containers request. It drops those capabilities from the spec or process
// file runc is about to read, then execs the real runc with the same
// arguments.
//
// Configuration comes from the environment dockerd gives it, so it has none of
// its own: LAMPYR_RUNC (default /usr/sbin/runc, then PATH) and
// LAMPYR_DROP_CAPS (default CAP_SYS_RESOURCE), both baked into a small shell
// shim by hack/host-prepare.sh.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"lampyr.dev/serving/clusters/hostprep/runcwrap"
)

func main() {
	drop := map[string]bool{}
	for _, c := range strings.Split(envOr("LAMPYR_DROP_CAPS", "CAP_SYS_RESOURCE"), ",") {
		if c = strings.TrimSpace(c); c != "" {
			drop[c] = true
		}
	}
	specs, processes := runcwrap.FilesToFilter(os.Args[1:])
	for _, f := range specs {
		if err := runcwrap.RewriteFile(f, runcwrap.FilterSpec, drop); err != nil {
			fail(fmt.Errorf("filter capabilities in %s: %w", f, err))
		}
	}
	for _, f := range processes {
		if err := runcwrap.RewriteFile(f, runcwrap.FilterProcess, drop); err != nil {
			fail(fmt.Errorf("filter capabilities in %s: %w", f, err))
		}
	}
	runc := os.Getenv("LAMPYR_RUNC")
	if runc == "" {
		runc = "/usr/sbin/runc"
		if _, err := os.Stat(runc); err != nil {
			if runc, err = exec.LookPath("runc"); err != nil {
				fail(fmt.Errorf("no runc found: set LAMPYR_RUNC"))
			}
		}
	}
	fail(syscall.Exec(runc, append([]string{runc}, os.Args[1:]...), os.Environ()))
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "lampyr-runc:", err)
	os.Exit(1)
}
