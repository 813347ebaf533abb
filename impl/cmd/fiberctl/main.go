// Command fiberctl is the operators' and tests' tool for fiberd:
//
//	fiberctl fibers   -endpoint HOST:PORT -router-key-file K -home NAME   live fibers of a Home
//	fiberctl grant    -endpoint HOST:PORT -router-key-file K -home NAME   the signed grant a Home runs under
//	fiberctl acquire  -endpoint ... / fiberctl release -endpoint ... ID
//	fiberctl grants   [-kubeconfig K] [-n NS]               CapacityGrants and their conditions
//	fiberctl template (-ref REPO@sha256:... | -file F) [-fleet-key-file K... (-sealers-file F | -sealer-public-key KEY)]
//	                                                        a sealed template's header; with keys, open it (debugging)
//	fiberctl fleet-key -out DIR                             generate a fleet key pair (private.pem, public.pem)
//	fiberctl decode-grant -grant-key-file PUB -file F       verify and print a signed grant
//
// A Home accepts only credentials minted for it by the router key
// (docs/security.md §3): fiberctl mints one from -router-key-file (Secret
// lampyr-system/fiber-router-key, key private.pem) for -home (the
// CapacityGrant's status.home), valid for routercred.TTL.
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
	"sigs.k8s.io/yaml"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/artifact"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/fiberd/client"
	"lampyr.dev/serving/impl/trust/routercred"
	"lampyr.dev/serving/impl/trust/seal"
	"lampyr.dev/serving/impl/trust/signedgrant"
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
	routerKeyFile := fs.String("router-key-file", os.Getenv("FIBERD_ROUTER_KEY_FILE"), "router private key PEM (Secret lampyr-system/fiber-router-key, key private.pem); mints a credential for -home")
	home := fs.String("home", os.Getenv("FIBERD_HOME"), "the Home's name (a CapacityGrant's status.home): the credential's audience")
	homeKey := fs.String("home-key-sha256", os.Getenv("FIBERD_HOME_KEY_SHA256"), "the Home's TLS key fingerprint (a CapacityGrant's status.homeKeySHA256): fiberd is reached over TLS and only that key is accepted; empty: plain HTTP (a Home of an earlier version, or fiberd run without --tls-key-file)")
	apiClient := func() (*client.Client, error) {
		cred, err := mintCredential(*routerKeyFile, *home, time.Now())
		if err != nil {
			return nil, err
		}
		if *homeKey != "" {
			return client.NewTLS(*endpoint, cred, *homeKey)
		}
		return client.New(*endpoint, cred)
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
		var keyFiles multi
		fs.Var(&keyFiles, "fleet-key-file", "fleet private key PEM (Secret lampyr-system/lampyr-fleet-key, key private.pem or retired-*.pem; repeatable); without it only the header is printed")
		sealersFile := fs.String("sealers-file", "", "an installation's authorized sealers: ConfigMap lampyr-system/lampyr-template-sealers as YAML (kubectl get -o yaml) or its data map")
		sealerKey := fs.String("sealer-public-key", "", "verify the signature with this sealer public key (base64 or PEM as `ly sealer show` prints it, or @FILE; the controller's: Secret lampyr-system/lampyr-controller-sealer, key public.pem)")
		ref := fs.String("ref", "", "digest-pinned sealed-template reference")
		file := fs.String("file", "", "sealed template blob on disk instead of -ref")
		var mirrors multi
		fs.Var(&mirrors, "registry-mirror", "from=to registry host mapping (repeatable)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		return showTemplate(ctx, out, templateOptions{fleetKeyFiles: keyFiles, sealersFile: *sealersFile, sealerKey: *sealerKey, ref: *ref, file: *file, mirrors: mirrors})
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

// mintCredential mints a router credential for home with the router key in
// keyFile (routercred.Mint), as fiber-router does for each Home.
func mintCredential(keyFile, home string, now time.Time) (string, error) {
	if keyFile == "" {
		return "", errors.New("-router-key-file is required: the router private key (kubectl -n lampyr-system get secret fiber-router-key -o jsonpath='{.data.private\\.pem}' | base64 -d > router.pem); a Home accepts only credentials minted for it")
	}
	if home == "" {
		return "", errors.New("-home is required: the Home's name, the credential's audience (kubectl get capacitygrant -n NS REVISION -o jsonpath='{.status.home}')")
	}
	b, err := os.ReadFile(keyFile)
	if err != nil {
		return "", fmt.Errorf("-router-key-file: %w", err)
	}
	key, err := routercred.ParsePrivateKey(b)
	if err != nil {
		return "", fmt.Errorf("-router-key-file %s: %w", keyFile, err)
	}
	return routercred.Mint(key, home, now, routercred.TTL)
}

type templateOptions struct {
	fleetKeyFiles          []string
	sealersFile, sealerKey string
	ref, file              string
	mirrors                []string
}

// showTemplate prints a sealed template's clear header and, given fleet keys
// and a trust (an installation's sealers, or one sealer key), opens it
// exactly as the grant controller does and prints the template.
func showTemplate(ctx context.Context, out io.Writer, o templateOptions) error {
	var sealed []byte
	var err error
	switch {
	case o.file != "" && o.ref != "":
		return errors.New("template: pass -ref or -file, not both")
	case o.file != "":
		if sealed, err = os.ReadFile(o.file); err != nil {
			return fmt.Errorf("-file: %w", err)
		}
	case o.ref != "":
		m, err := artifact.ParseMirrors(o.mirrors)
		if err != nil {
			return fmt.Errorf("-registry-mirror: %w", err)
		}
		if sealed, _, err = artifact.FetchTemplate(ctx, o.ref, m.RemoteOptions()...); err != nil {
			return err
		}
	default:
		return errors.New("template: pass -ref REPO@sha256:... or -file PATH")
	}
	h, err := seal.Inspect(sealed)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "fleet key id:  %s\nsealer key id: %s\n", h.FleetKeyID, h.SealerKeyID)
	if len(o.fleetKeyFiles) == 0 {
		if o.sealersFile != "" || o.sealerKey != "" {
			return errors.New("template: opening needs -fleet-key-file (the header above names the fleet key)")
		}
		return nil
	}
	var fleet []*seal.PrivateKey
	for _, f := range o.fleetKeyFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("-fleet-key-file: %w", err)
		}
		k, err := seal.ParsePrivateKeyPEM(b)
		if err != nil {
			return fmt.Errorf("-fleet-key-file %s: %w", f, err)
		}
		fleet = append(fleet, k)
	}
	var trust *seal.Trust
	var label string
	switch {
	case o.sealersFile != "" && o.sealerKey != "":
		return errors.New("template: pass -sealers-file or -sealer-public-key, not both")
	case o.sealersFile != "":
		sealers, err := readSealersFile(o.sealersFile)
		if err != nil {
			return err
		}
		trust = seal.NewTrust(sealers...)
		label = "signature verified and sealer authorized by -sealers-file " + o.sealersFile
	case o.sealerKey != "":
		v := o.sealerKey
		if f, ok := strings.CutPrefix(v, "@"); ok {
			b, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("-sealer-public-key: %w", err)
			}
			v = string(b)
		}
		pub, err := seal.ParseSealerPublicKey(v)
		if err != nil {
			return fmt.Errorf("-sealer-public-key: %w", err)
		}
		if id := seal.SealerKeyID(pub); id != h.SealerKeyID {
			return fmt.Errorf("-sealer-public-key is key %s, but the template was signed by %s", id, h.SealerKeyID)
		}
		trust = seal.NewTrust(seal.TrustedSealer{Name: "-sealer-public-key", Key: pub, Namespaces: []string{seal.AllNamespaces}})
		label = "signature verified with -sealer-public-key; namespace authorization not checked against an installation's trust (use -sealers-file)"
	default:
		return errors.New("template: opening checks the signature first: pass -sealers-file (an installation's lampyr-template-sealers) or -sealer-public-key KEY of the sealer named above")
	}
	opened, err := seal.Open(fleet, trust, sealed)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "sealer:        %s (namespaces %s)\n%s\n", opened.Sealer.Name, strings.Join(opened.Sealer.Namespaces, ","), label)
	return printJSON(out, opened.Template)
}

// readSealersFile reads authorized sealers from a ConfigMap manifest (its
// data) or a bare data map, as seal.ParseSealers reads the ConfigMap.
func readSealersFile(path string) ([]seal.TrustedSealer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-sealers-file: %w", err)
	}
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	data := map[string]string{}
	if err := yaml.Unmarshal(b, &cm); err == nil && cm.Kind == "ConfigMap" {
		data = cm.Data
	} else if err := yaml.UnmarshalStrict(b, &data); err != nil {
		return nil, fmt.Errorf("-sealers-file %s: want the ConfigMap lampyr-template-sealers as YAML, or its data: a map of identity NAME to an entry with publicKey and namespaces: %w", path, err)
	}
	sealers, err := seal.ParseSealers(data)
	if err != nil {
		return nil, fmt.Errorf("-sealers-file %s: %w", path, err)
	}
	if len(sealers) == 0 {
		return nil, fmt.Errorf("-sealers-file %s lists no sealer", path)
	}
	return sealers, nil
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
	l, err := dyn.Resource(contract.CapacityGrants).Namespace(ns).List(ctx, metav1.ListOptions{})
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
