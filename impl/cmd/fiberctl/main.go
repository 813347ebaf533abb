// Command fiberctl is the operators' and tests' tool for fiberd:
//
//	fiberctl fibers   -endpoint HOST:PORT -token-file F     live fibers of a Home
//	fiberctl grant    -endpoint HOST:PORT -token-file F     the signed grant a Home runs under
//	fiberctl acquire  -endpoint ... / fiberctl release -endpoint ... ID
//	fiberctl grants   [-kubeconfig K] [-n NS]               CapacityGrants and their conditions
//	fiberctl template -fleet-key-file K (-ref REPO@sha256:... | -file F)
//	                                                        open a sealed template (debugging)
//	fiberctl fleet-key -out DIR                             generate a fleet key pair (private.pem, public.pem)
//	fiberctl decode-grant -grant-key-file PUB -file F       verify and print a signed grant
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/fiberd"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/fiberd/seal"
	"lampyr.dev/serving/impl/fiberd/signedgrant"
	"lampyr.dev/serving/impl/grant"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fiberctl:", err)
		os.Exit(1)
	}
}

const usage = "usage: fiberctl fibers|grant|acquire|release|grants|template|fleet-key|decode-grant [flags]; see `fiberctl CMD -h`"

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("fiberctl "+cmd, flag.ContinueOnError)
	endpoint := fs.String("endpoint", os.Getenv("FIBERD_ENDPOINT"), "fiberd host:port (a CapacityGrant's status.homeEndpoint)")
	token := fs.String("token", os.Getenv("FIBERD_TOKEN"), "router token")
	tokenFile := fs.String("token-file", "", "file holding the router token")
	apiClient := func() (*client.Client, error) {
		tok := *token
		if *tokenFile != "" {
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				return nil, err
			}
			tok = strings.TrimSpace(string(b))
		}
		return client.New(*endpoint, tok)
	}
	switch cmd {
	case "fibers":
		if err := fs.Parse(args); err != nil {
			return err
		}
		c, err := apiClient()
		if err != nil {
			return err
		}
		l, err := c.List(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "revision %s, mode %s, maxFibers %d\n", l.Revision, l.Mode, l.Max)
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tREQUESTS\tAGE")
		for _, f := range l.Fibers {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", f.ID, f.State, f.Requests, (time.Duration(f.AgeSeconds * float64(time.Second))).Round(time.Millisecond))
		}
		return tw.Flush()
	case "grant":
		if err := fs.Parse(args); err != nil {
			return err
		}
		c, err := apiClient()
		if err != nil {
			return err
		}
		g, err := c.Grant(ctx)
		if err != nil {
			return err
		}
		return printJSON(out, g)
	case "acquire":
		if err := fs.Parse(args); err != nil {
			return err
		}
		c, err := apiClient()
		if err != nil {
			return err
		}
		f, err := c.Acquire(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, f.ID)
		return nil
	case "release":
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return errors.New("release: want one fiber ID")
		}
		c, err := apiClient()
		if err != nil {
			return err
		}
		return c.Release(ctx, fs.Arg(0))
	case "grants":
		kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig")
		ns := fs.String("n", "", "namespace (default: all)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		return listGrants(ctx, out, *kubeconfig, *ns)
	case "template":
		keyFile := fs.String("fleet-key-file", "", "fleet private key PEM (Secret lampyr-system/lampyr-fleet-key, key private.pem)")
		ref := fs.String("ref", "", "digest-pinned sealed-template reference")
		file := fs.String("file", "", "sealed template blob on disk instead of -ref")
		var mirrors multi
		fs.Var(&mirrors, "registry-mirror", "from=to registry host mapping (repeatable)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		return openTemplate(ctx, out, *keyFile, *ref, *file, mirrors)
	case "fleet-key":
		dir := fs.String("out", ".", "directory for private.pem and public.pem")
		if err := fs.Parse(args); err != nil {
			return err
		}
		k, err := seal.GenerateFleetKey()
		if err != nil {
			return err
		}
		priv, err := k.MarshalPEM()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(*dir, "private.pem"), priv, 0o600); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(*dir, "public.pem"), k.Public().MarshalPEM(), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(out, "fleet key %s written to %s\n", k.Public().KeyID(), *dir)
		return nil
	case "decode-grant":
		keyFile := fs.String("grant-key-file", "", "grant controller public key PEM (Secret lampyr-system/lampyr-grant-signing-key, key public.pem)")
		file := fs.String("file", "", "signed grant (Home Secret key grant)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		pemb, err := os.ReadFile(*keyFile)
		if err != nil {
			return fmt.Errorf("-grant-key-file: %w", err)
		}
		pub, err := signedgrant.ParsePublicKey(pemb)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(*file)
		if err != nil {
			return fmt.Errorf("-file: %w", err)
		}
		c, verr := signedgrant.Verify(pub, []byte(strings.TrimSpace(string(b))), time.Now())
		if c.GrantID != "" {
			printJSON(out, c)
		}
		return verr
	default:
		return fmt.Errorf("unknown command %q; %s", cmd, usage)
	}
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func printJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func openTemplate(ctx context.Context, out io.Writer, keyFile, ref, file string, mirrors []string) error {
	pemb, err := os.ReadFile(keyFile)
	if err != nil {
		return fmt.Errorf("-fleet-key-file: %w", err)
	}
	key, err := seal.ParsePrivateKeyPEM(pemb)
	if err != nil {
		return err
	}
	var sealed []byte
	switch {
	case file != "":
		if sealed, err = os.ReadFile(file); err != nil {
			return err
		}
	case ref != "":
		m, err := fiberd.ParseMirrors(mirrors)
		if err != nil {
			return err
		}
		if sealed, _, err = artifact.FetchTemplate(ctx, ref, m.RemoteOptions()...); err != nil {
			return err
		}
	default:
		return errors.New("template: pass -ref REPO@sha256:... or -file PATH")
	}
	if id, err := seal.SealedKeyID(sealed); err == nil {
		fmt.Fprintf(out, "sealed to fleet key %s (this key: %s)\n", id, key.Public().KeyID())
	}
	t, err := seal.Open(key, sealed)
	if err != nil {
		return err
	}
	return printJSON(out, t)
}

func listGrants(ctx context.Context, out io.Writer, kubeconfig, ns string) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return printGrants(ctx, out, dyn, ns)
}

func printGrants(ctx context.Context, out io.Writer, dyn dynamic.Interface, ns string) error {
	l, err := dyn.Resource(grant.GrantGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tADMITTED\tHOME\tREADY\tGRANT\tEXPIRES\tENDPOINT\tREASON")
	for _, u := range l.Items {
		var g v1alpha1.CapacityGrant
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &g); err != nil {
			return err
		}
		st := func(t string) string {
			if c := g.Status.GetCondition(v1alpha1.GrantConditionAdmitted); t == "a" && c != nil {
				return string(c.Status)
			}
			if c := g.Status.GetCondition(v1alpha1.GrantConditionHomeReady); t == "h" && c != nil {
				return string(c.Status)
			}
			if c := g.Status.GetCondition(v1alpha1.GrantConditionReady); t == "r" && c != nil {
				return string(c.Status)
			}
			return "-"
		}
		reason, exp := "", ""
		if c := g.Status.GetCondition(v1alpha1.GrantConditionReady); c != nil && !c.IsTrue() {
			reason = c.Reason + ": " + c.Message
		}
		if g.Status.ExpiresAt != nil {
			exp = time.Until(g.Status.ExpiresAt.Time).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Namespace, g.Name, st("a"), st("h"), st("r"), g.Status.GrantID, exp, g.Status.HomeEndpoint, reason)
	}
	return tw.Flush()
}
