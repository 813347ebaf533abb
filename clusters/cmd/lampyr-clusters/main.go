// Command lampyr-clusters builds the offline cluster inputs and manages named
// Kind clusters wired to the local registry.
//
//	lampyr-clusters inputs              build (or find cached) node and registry images
//	lampyr-clusters up NAME...          create or reuse clusters, in parallel, and install
//	                                    their profile (--profile; the pair stock, lampyr: their own);
//	                                    --eventing (or LAMPYR_EVENTING=1) adds Knative Eventing
//	lampyr-clusters down NAME...        delete clusters
//	lampyr-clusters down --all          delete every Kind cluster on this Docker engine
//	lampyr-clusters logs NAME DIR       export node logs (kind export logs)
//	lampyr-clusters load NAME TAR...    load docker-archive images into a cluster
//	lampyr-clusters info NAME           print a cluster's state (kubeconfig, ports)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/environ"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/progress"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		if errors.Is(err, context.Canceled) {
			os.Exit(130)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: lampyr-clusters inputs|up|down|logs|load|info ...")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	keep := fs.Bool("keep", environ.Set(environ.Keep), "keep clusters whose creation failed or was interrupted")
	provider := fs.String("provider", environ.Provider(), "networking provider for installed profiles ("+strings.Join(networking.Names(), ", ")+"; default from "+environ.Networking+", else "+networking.Default+")")
	all := fs.Bool("all", false, "down: every Kind cluster on this Docker engine (CI starts from none)")
	profile := fs.String("profile", "", "install profile for every cluster named (stock, lampyr, none); default: the paired clusters' own (stock: stock, lampyr: lampyr), none for any other name")
	eventing := fs.Bool("eventing", environ.Set(environ.Eventing), "up: also install Knative Eventing (core, MT channel-based Broker, InMemoryChannel) on every cluster given a profile")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	log := progress.New(os.Stderr)
	env := clusters.NewEnv(log, environ.Clusters())
	start := time.Now()
	defer func() { log.Printf("lampyr-clusters %s: %s", args[0], time.Since(start).Round(100*time.Millisecond)) }()
	switch args[0] {
	case "inputs":
		res, err := env.Inputs(ctx)
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(res)
	case "up":
		if fs.NArg() == 0 {
			return errors.New("usage: lampyr-clusters up NAME...")
		}
		profileOf := func(name string) string {
			if *profile != "" {
				return *profile
			}
			p, _ := clusters.PairedProfile(name)
			return p
		}
		var profiles []string
		for _, n := range fs.Args() {
			profiles = append(profiles, profileOf(n))
		}
		env.Announce(ctx, profiles, *provider)
		env.Prebuild(ctx, profiles, *provider)
		defer log.Summary("lampyr-clusters up: where the time went", time.Second)
		infos, err := env.Up(ctx, fs.Args(), *keep)
		if err != nil {
			return err
		}
		for _, i := range infos {
			p := profileOf(i.Name)
			if p == "" {
				log.Printf("cluster %s: no profile stated (--profile stock|lampyr): left bare", i.Name)
				continue
			}
			if p == "none" {
				continue
			}
			if err := env.Install(ctx, i, p, *provider); err != nil {
				return err
			}
			if *eventing {
				if err := env.InstallEventing(ctx, i); err != nil {
					return err
				}
			}
		}
		for _, i := range infos {
			log.Printf("cluster %s: KUBECONFIG=%s gateway %s registry %s", i.Name, i.Kubeconfig, i.GatewayURL(), i.Registry)
		}
		return nil
	case "down":
		names := fs.Args()
		if *all {
			if len(names) > 0 {
				return errors.New("usage: lampyr-clusters down --all, or down NAME...: not both")
			}
			var err error
			if names, err = env.Manager().List(); err != nil {
				return err
			}
			if len(names) == 0 {
				log.Printf(" ✓ No Kind clusters to delete")
			}
		}
		for _, n := range names {
			if err := log.Step("Deleting cluster "+n, func() error { return env.Manager().Delete(n) }); err != nil {
				return err
			}
		}
		return nil
	case "logs":
		if fs.NArg() != 2 {
			return errors.New("usage: lampyr-clusters logs NAME DIR")
		}
		return env.Manager().ExportLogs(fs.Arg(0), fs.Arg(1))
	case "load":
		if fs.NArg() < 2 {
			return errors.New("usage: lampyr-clusters load NAME TAR...")
		}
		return env.Manager().LoadImageArchives(fs.Arg(0), fs.Args()[1:]...)
	case "info":
		info, err := env.Manager().ReadInfo(fs.Arg(0))
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(info)
	}
	return fmt.Errorf("unknown command %q", args[0])
}
