// Command lampyr-inputs builds (or finds cached) the offline cluster inputs
// (node image, registry image) and nothing else. It links only what the
// inputs need (clusters/inputs: no Kubernetes client, no Knative), so it
// compiles in seconds from a cold cache: the justfile starts it in the
// background while a suite's test binary compiles, and the suite's harness
// then waits for it (clusters/inputs takes a lock on the cache) and finds
// the inputs built. `lampyr-clusters inputs` does the same in the
// foreground.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"lampyr.dev/serving/clusters/environ/inputsenv"
	"lampyr.dev/serving/clusters/firstrun"
	"lampyr.dev/serving/clusters/inputs"
	"lampyr.dev/serving/impl/progress"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	announce := flag.Bool("announce", false, "print what a first run with this cache builds and about how long it takes (nothing when the inputs are cached), then exit")
	flag.Parse()
	if *announce {
		cache := inputsenv.Cache()
		more := fmt.Sprintf("A run of the stock/Lampyr pair also builds Knative Serving, Traefik, net-gateway-api and Lampyr: about %s more, and its suite compiles meanwhile.", firstrun.Minutes(firstrun.PairMinutes()))
		if line := firstrun.Inputs(ctx, filepath.Join(cache, "go")).Line(cache, more); line != "" {
			fmt.Println(line)
		}
		return
	}
	log := progress.New(os.Stderr)
	b := inputs.NewBuilder(inputsenv.Cache(), log)
	b.DebianMirror = inputsenv.Mirror()
	err := log.Step("Cluster inputs (cache "+b.Cache+")", func() error {
		_, err := b.Build(ctx)
		return err
	})
	log.Summary("lampyr-inputs: where the time went", time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
