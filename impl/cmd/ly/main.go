// Command ly is the Lampyr CLI (seed 002; README.md, "Deploy with ly"):
//
//	ly build [dir]                                  build the snapshot artifact into dir/.lampyr/artifact
//	ly push --image REGISTRY/REPO:TAG [dir]         publish it unless the registry has it
//	ly deploy --image REGISTRY/REPO:TAG [dir]       push, seal the template, apply the Service, wait
//	ly status [NAME]                                Services, Revisions, grants
//	ly scale NAME --max N                           set max-scale (the one scale knob)
//	ly logs NAME                                    Home (fiberd) logs of the Service's Revisions
//	ly audit                                        what is deployed, and what is inconsistent
//	ly event NAME                                   recent events of a Service and its children
//	ly delete NAME                                  delete a Service
//	ly cluster describe                             fleet key, template repository, registry, sealer identities
//	ly cluster authorize-sealer NAME (--public-key KEY | --self) --namespaces a,b|'*' [--revoke]
//	                                                let a ly identity seal templates (administrators)
//	ly cluster rotate-fleet-key                     make a new fleet key current (administrators)
//	ly sealer show                                  this ly's sealer identity and how to get it authorized
//	ly image-snapshot IMAGE@DIGEST... [--register]  snapshot runnable images; map them in config-lampyr
//	ly scaffold service NAME [--upgrade] [dir]      a new service (or a new adapter)
//
// ly signs every template it seals with its sealer identity, an Ed25519 key
// in ~/.config/lampyr/sealer.pem ($XDG_CONFIG_HOME/lampyr/sealer.pem;
// --sealer-key or $LAMPYR_SEALER_KEY name another file), created on first
// use. The cluster runs a template only if an administrator authorized that
// identity for the Revision's namespace (docs/security.md §2).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/term"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/install/installenv"
	"lampyr.dev/serving/impl/install/networking"
	"lampyr.dev/serving/impl/ly"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ly:", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

const usage = `usage: ly COMMAND [flags]
  build [dir]                              build the snapshot artifact
  push --image REGISTRY/REPO:TAG [dir]     publish the artifact if the registry lacks it
  deploy --image REGISTRY/REPO:TAG [dir]   push, seal, apply the Service and wait (4m)
  status [NAME]   scale NAME --max N   logs NAME   audit   event NAME   delete NAME
  sealer show                              this ly's sealer identity (key id, public key) and the
                                           command an administrator runs to authorize it
  cluster install [--provider gateway-api] install Lampyr; authorizes this ly's identity for every namespace
  cluster describe                         fleet key, template repository, sealer identities
  cluster authorize-sealer NAME (--public-key KEY | --self) --namespaces a,b|'*' [--revoke]
                                           (administrators) let an identity seal templates for namespaces;
                                           --revoke removes it
  cluster rotate-fleet-key                 (administrators) new fleet key; running Revisions keep running
  scaffold service NAME [--upgrade] [dir]
  image-snapshot IMAGE@DIGEST... [--port 8080] [--protocol http1|h2c] [--repository R] [--register]
                                           snapshot runnable images; --register maps each image
                                           (repository@sha256:...) in config-lampyr
common flags: --context, --kubeconfig, --namespace/-n, --output terminal|plain|json,
  --sealer-key FILE (default $LAMPYR_SEALER_KEY, else ~/.config/lampyr/sealer.pem; created on first use)

Templates are signed by this ly's sealer identity; the cluster runs them only once an
administrator authorized it: give them the command ` + "`ly sealer show`" + ` prints.`

// common are the flags every command takes.
type common struct {
	kubeconfig, context, namespace, output, sealerKey string
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: KUBECONFIG or ~/.kube/config)")
	fs.StringVar(&c.context, "context", "", "exact kubeconfig context (default: the current context)")
	fs.StringVar(&c.namespace, "namespace", "default", "namespace of the Service")
	fs.StringVar(&c.namespace, "n", "default", "shorthand for --namespace")
	fs.StringVar(&c.output, "output", "", "terminal, plain or json (default: terminal on a terminal, else plain)")
	fs.StringVar(&c.sealerKey, "sealer-key", "", "this ly's sealer identity (default: $"+ly.SealerKeyEnv+", else $XDG_CONFIG_HOME/lampyr/sealer.pem or ~/.config/lampyr/sealer.pem; created on first use)")
}

// sealer loads this ly's sealer identity, creating it if create is set, and
// tells on log when it did (and when the key file is too open).
func (c *common) sealer(create bool, log io.Writer) (*ly.Sealer, error) {
	path, err := ly.SealerKeyPath(c.sealerKey)
	if err != nil {
		return nil, err
	}
	s, err := ly.LoadSealer(path, create)
	if err != nil {
		return nil, err
	}
	if s.Created {
		fmt.Fprintln(log, s.CreatedMessage(c.namespace))
	}
	if s.Warning != "" {
		fmt.Fprintln(log, "warning:", s.Warning)
	}
	return s, nil
}

func (c *common) progress(w io.Writer) (*ly.Progress, error) {
	mode := c.output
	if mode == "" {
		mode = ly.OutputPlain
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			mode = ly.OutputTerminal
		}
	}
	switch mode {
	case ly.OutputTerminal, ly.OutputPlain, ly.OutputJSON:
	default:
		return nil, usageError{fmt.Errorf("--output %q: want terminal, plain or json", c.output)}
	}
	return ly.NewProgress(w, mode, nil), nil
}

func (c *common) cluster() (*ly.Cluster, error) { return ly.Connect(c.kubeconfig, c.context) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stdout, usage)
		if len(args) == 0 {
			return usageError{errors.New("no command")}
		}
		return nil
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("ly "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	image := fs.String("image", "", "registry image destination with an explicit tag (REGISTRY/REPOSITORY:TAG)")
	artifactDir := fs.String("artifact", "", "artifact directory (default: DIR/.lampyr/artifact)")
	traffic := fs.String("traffic", "", "comma-separated REVISION=PERCENT targets (@latest for the new one)")
	timeout := fs.Duration("timeout", ly.DefaultDeployTimeout, "how long deploy waits for the Revision, Route and visibility")
	maxScale := fs.Int("max", -1, "scale: the most concurrent fibers (autoscaling.knative.dev/max-scale)")
	upgrade := fs.Bool("upgrade", false, "scaffold: replace only the adapter of an existing service")
	tail := fs.Int64("tail", 100, "logs: lines per Home")
	provider := fs.String("provider", installenv.Provider(networking.Default), "cluster install: networking provider ("+strings.Join(networking.Names(), ", ")+"; default from "+installenv.Networking+", else "+networking.Default+")")
	nodePort := fs.Int("node-port", 0, "cluster install: the gateway's NodePort (default: the cluster's recorded port, else 30080)")
	port := fs.Int("port", 8080, "image-snapshot: the port the image's server listens on ($PORT)")
	protocol := fs.String("protocol", "http1", "image-snapshot: http1 or h2c")
	repository := fs.String("repository", "", "image-snapshot: where to push (default: REGISTRY/lampyr/snapshots/<image name>)")
	register := fs.Bool("register", false, "image-snapshot: map each image (repository@sha256:...) to its snapshot in config-lampyr image-snapshots")
	var af authorizeFlags
	af.register(fs)
	if err := parseInterspersed(fs, args); err != nil {
		return usageError{err}
	}
	pos := fs.Args()
	dirArg := func() string {
		if len(pos) > 0 {
			return pos[0]
		}
		return "."
	}
	nameArg := func() (string, error) {
		if len(pos) != 1 {
			return "", usageError{fmt.Errorf("ly %s needs exactly one Service NAME", cmd)}
		}
		return pos[0], nil
	}
	switch cmd {
	case "build":
		dir := dirArg()
		p, err := ly.LoadProject(dir)
		if err != nil {
			return err
		}
		pr, err := c.progress(stdout)
		if err != nil {
			return err
		}
		var b *ly.Built
		err = pr.Phase("Build "+p.Name, func(ph *ly.Phase) (err error) {
			b, err = ly.Build(ctx, dir, p, ly.BuildOptions{ArtifactDir: *artifactDir, Log: stderr})
			if err == nil {
				ph.Detail("snapshot artifact %s in %s", b.Digest, b.Dir)
			}
			return err
		})
		if err != nil {
			return err
		}
		pr.Result("built "+b.Digest.String(), map[string]string{"digest": b.Digest.String(), "dir": b.Dir})
		return nil
	case "push":
		tag, err := ly.ParseImageTag(*image)
		if err != nil {
			return usageError{err}
		}
		dir := dirArg()
		ad := *artifactDir
		if ad == "" {
			ad = filepath.Join(dir, ly.ArtifactDir)
		}
		b, err := ly.LoadArtifact(ad)
		if err != nil {
			return err
		}
		pr, err := c.progress(stdout)
		if err != nil {
			return err
		}
		var res *ly.PushResult
		if err := pr.Phase("Push "+tag.String(), func(ph *ly.Phase) (err error) {
			res, err = ly.Push(ctx, b, tag)
			return err
		}); err != nil {
			return err
		}
		pr.Result(res.Ref.String(), map[string]any{"ref": res.Ref.String(), "pushed": res.Pushed})
		return nil
	case "deploy":
		tag, err := ly.ParseImageTag(*image)
		if err != nil {
			return usageError{err}
		}
		tr, err := ly.ParseTraffic(*traffic)
		if err != nil {
			return usageError{err}
		}
		dir := dirArg()
		p, err := ly.LoadProject(dir)
		if err != nil {
			return err
		}
		pr, err := c.progress(stdout)
		if err != nil {
			return err
		}
		cl, err := c.cluster()
		if err != nil {
			return err
		}
		sealer, err := c.sealer(true, stderr)
		if err != nil {
			return err
		}
		res, err := ly.Deploy(ctx, cl, dir, p, ly.DeployOptions{Image: tag, ArtifactDir: *artifactDir, Namespace: c.namespace, Traffic: tr, Timeout: *timeout, Sealer: sealer}, pr)
		if err != nil {
			return err
		}
		msg := fmt.Sprintf("Service %s/%s is ready: %s (%s, Revision %s)", res.Namespace, res.Service, res.URL, res.Visibility, res.Revision)
		pr.Result(msg, res)
		return nil
	case "status":
		cl, err := c.cluster()
		if err != nil {
			return err
		}
		return ly.Status(ctx, cl, c.namespace, pos, stdout, c.output == ly.OutputJSON)
	case "scale":
		name, err := nameArg()
		if err != nil {
			return err
		}
		if *maxScale < 0 {
			return usageError{errors.New("ly scale needs --max N (0: the installation's default)")}
		}
		cl, err := c.cluster()
		if err != nil {
			return err
		}
		sealer, err := c.sealer(true, stderr)
		if err != nil {
			return err
		}
		rev, err := ly.Scale(ctx, cl, c.namespace, name, int32(*maxScale), sealer)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Service %s/%s: max-scale %d (new Revision %s)\n", c.namespace, name, *maxScale, rev)
		return nil
	case "logs":
		name, err := nameArg()
		if err != nil {
			return err
		}
		cl, err := c.cluster()
		if err != nil {
			return err
		}
		return ly.Logs(ctx, cl, c.namespace, name, *tail, stdout)
	case "audit":
		cl, err := c.cluster()
		if err != nil {
			return err
		}
		problems, err := ly.Audit(ctx, cl, c.namespace, stdout)
		if err != nil {
			return err
		}
		if problems > 0 {
			return fmt.Errorf("%d inconsistencies found", problems)
		}
		return nil
	case "event", "events":
		name, err := nameArg()
		if err != nil {
			return err
		}
		cl, err := c.cluster()
		if err != nil {
			return err
		}
		return ly.Events(ctx, cl, c.namespace, name, stdout)
	case "delete":
		name, err := nameArg()
		if err != nil {
			return err
		}
		cl, err := c.cluster()
		if err != nil {
			return err
		}
		if err := ly.Delete(ctx, cl, c.namespace, name, *timeout); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "deleted Service %s/%s and everything it owned\n", c.namespace, name)
		return nil
	case "cluster":
		return clusterCommand(ctx, c, pos, af, *provider, *nodePort, stdout, stderr)
	case "sealer":
		if len(pos) != 1 || pos[0] != "show" {
			return usageError{errors.New("usage: ly sealer show [--sealer-key FILE] [-n NAMESPACE]")}
		}
		return sealerShow(c, stdout, stderr)
	case "image-snapshot":
		if len(pos) == 0 {
			return usageError{errors.New("usage: ly image-snapshot IMAGE@DIGEST... [--register]")}
		}
		if *port < 1 || *port > 65535 {
			return usageError{fmt.Errorf("--port %d: want 1-65535", *port)}
		}
		var snaps []*ly.ImageSnapshot
		for _, image := range pos {
			s, err := ly.SnapshotImage(ctx, image, ly.ImageSnapshotOptions{Repository: *repository, Port: int32(*port), Protocol: *protocol})
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%s -> %s\n", s.Image, s.Snapshot)
			if len(s.Dropped) > 0 {
				fmt.Fprintf(stderr, "  dropped (a snapshot holds files, directories and symlinks only): %v\n", s.Dropped)
			}
			snaps = append(snaps, s)
		}
		if !*register {
			return nil
		}
		cl, err := c.cluster()
		if err != nil {
			return err
		}
		rep, err := ly.EditImageSnapshots(ctx, cl, snaps, nil)
		if err != nil {
			return err
		}
		for _, n := range rep.Notes() {
			fmt.Fprintln(stderr, "note:", n)
		}
		fmt.Fprintf(stdout, "registered %d image(s) in %s/%s image-snapshots: Revisions of these images without lampyr.dev annotations now run from the snapshots\n", len(snaps), cl.LampyrNamespace, contract.ConfigMapName)
		return nil
	case "scaffold":
		if len(pos) < 2 || pos[0] != "service" {
			return usageError{errors.New("usage: ly scaffold service NAME [--upgrade] [dir]")}
		}
		dir := pos[1]
		if len(pos) > 2 {
			dir = pos[2]
		}
		files, err := ly.Scaffold(dir, pos[1], *upgrade)
		if err != nil {
			return err
		}
		for _, f := range files {
			fmt.Fprintln(stdout, "wrote", filepath.Join(dir, f))
		}
		return nil
	}
	return usageError{fmt.Errorf("unknown command %q\n%s", cmd, usage)}
}

// parseInterspersed lets flags follow positional arguments (ly deploy DIR
// --image ...), as users type them.
func parseInterspersed(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	return fs.Parse(pos)
}
