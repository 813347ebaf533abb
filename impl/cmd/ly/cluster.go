package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/ly"
	"lampyr.dev/serving/impl/trust/seal"
)

const clusterUsage = "usage: ly cluster install|describe|authorize-sealer NAME (--public-key KEY | --self) --namespaces a,b|'*' [--revoke]|rotate-fleet-key"

// authorizeFlags are `ly cluster authorize-sealer`'s flags.
type authorizeFlags struct {
	publicKey, namespaces string
	self, revoke          bool
}

func (a *authorizeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.publicKey, "public-key", "", "cluster authorize-sealer: the identity's public key (base64 or PEM, as `ly sealer show` prints it)")
	fs.BoolVar(&a.self, "self", false, "cluster authorize-sealer: authorize this ly's own identity (--sealer-key)")
	fs.StringVar(&a.namespaces, "namespaces", "", "cluster authorize-sealer: namespaces the identity may seal for, comma-separated, or '*' for all")
	fs.BoolVar(&a.revoke, "revoke", false, "cluster authorize-sealer: remove the identity instead")
}

func clusterCommand(ctx context.Context, c common, pos []string, af authorizeFlags, provider string, nodePort int, stdout, stderr io.Writer) error {
	if len(pos) == 0 {
		return usageError{errors.New(clusterUsage)}
	}
	switch pos[0] {
	case "install":
		if len(pos) != 1 {
			return usageError{errors.New(clusterUsage)}
		}
		if err := clusterInstall(ctx, c, provider, nodePort, stderr); err != nil {
			return err
		}
		if err := authorizeInstaller(ctx, c, stderr); err != nil {
			return err
		}
		return clusterDescribe(ctx, c, stdout, stderr)
	case "describe":
		if len(pos) != 1 {
			return usageError{errors.New(clusterUsage)}
		}
		return clusterDescribe(ctx, c, stdout, stderr)
	case "authorize-sealer":
		return authorizeSealer(ctx, c, pos[1:], af, stdout, stderr)
	case "rotate-fleet-key":
		if len(pos) != 1 {
			return usageError{errors.New("usage: ly cluster rotate-fleet-key")}
		}
		cl, err := c.cluster()
		if err != nil {
			return err
		}
		rot, err := ly.RotateFleetKey(ctx, cl)
		if err != nil {
			return err
		}
		if c.output == ly.OutputJSON {
			return json.NewEncoder(stdout).Encode(rot)
		}
		ns := cl.LampyrNamespace
		fmt.Fprintf(stdout, "rotated the fleet key of context %s\n  old key id: %s (kept as %s in Secret %s/%s)\n  new key id: %s (published in ConfigMap %s/%s)\n",
			cl.Context, rot.OldKeyID, rot.RetiredAs, ns, contract.FleetKeyName, rot.NewKeyID, ns, contract.FleetKeyName)
		fmt.Fprintf(stdout, "Running Revisions keep running: their templates still open with the retired key. New deploys seal to the new key.\n")
		fmt.Fprintf(stdout, "Once every Revision sealed to the old key is redeployed or gone, delete the retired key:\n  kubectl -n %s patch secret %s --type=json -p '[{\"op\":\"remove\",\"path\":\"/data/%s\"}]'\n", ns, contract.FleetKeyName, rot.RetiredAs)
		if len(rot.Retired) > 1 {
			fmt.Fprintf(stdout, "Retired keys the Secret holds: %s\n", strings.Join(rot.Retired, ", "))
		}
		return nil
	}
	return usageError{fmt.Errorf("unknown cluster command %q\n%s", pos[0], clusterUsage)}
}

func authorizeSealer(ctx context.Context, c common, args []string, af authorizeFlags, stdout, stderr io.Writer) error {
	if len(args) != 1 {
		return usageError{errors.New("ly cluster authorize-sealer needs exactly one identity NAME (e.g. " + ly.DefaultSealerName() + ")\n" + clusterUsage)}
	}
	a := ly.SealerAuthorization{Name: args[0], Revoke: af.revoke}
	if !af.revoke {
		switch {
		case af.publicKey != "" && af.self:
			return usageError{errors.New("--public-key and --self: give one (--self authorizes this ly's own identity)")}
		case af.self:
			s, err := c.sealer(true, stderr)
			if err != nil {
				return err
			}
			a.Key = s.Key.Public()
		case af.publicKey != "":
			k, err := seal.ParseSealerPublicKey(af.publicKey)
			if err != nil {
				return usageError{fmt.Errorf("--public-key: %w (the identity's owner prints it with `ly sealer show`)", err)}
			}
			a.Key = k
		default:
			return usageError{errors.New("ly cluster authorize-sealer needs --public-key KEY (from the identity owner's `ly sealer show`) or --self")}
		}
		ns, err := ly.ParseNamespaces(af.namespaces)
		if err != nil {
			return usageError{err}
		}
		a.Namespaces = ns
	} else if af.publicKey != "" || af.self || af.namespaces != "" {
		return usageError{errors.New("--revoke removes the identity by NAME alone: drop --public-key, --self and --namespaces")}
	}
	cl, err := c.cluster()
	if err != nil {
		return err
	}
	ch, err := ly.AuthorizeSealer(ctx, cl, a)
	if err != nil {
		return err
	}
	for _, w := range ch.Warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	if c.output == ly.OutputJSON {
		return json.NewEncoder(stdout).Encode(ch)
	}
	switch ch.Action {
	case "revoked":
		fmt.Fprintf(stdout, "revoked sealer %s (was %s) in %s: Revisions it sealed stop at their next Home start or grant change (TemplateUnauthenticated) unless redeployed by an authorized identity\n", ch.Name, ch.Previous, ch.ConfigMap)
	case "unchanged":
		fmt.Fprintf(stdout, "sealer %s (key %s) is already authorized for %s in %s: nothing changed\n", ch.Name, ch.KeyID, strings.Join(a.Namespaces, ","), ch.ConfigMap)
	default:
		fmt.Fprintf(stdout, "%s sealer %s (key %s) in %s: it may seal templates for %s\n", ch.Action, ch.Name, ch.KeyID, ch.ConfigMap, namespacesText(a.Namespaces))
		if ch.Previous != "" {
			fmt.Fprintf(stdout, "  was: %s\n", ch.Previous)
		}
	}
	return nil
}

func namespacesText(ns []string) string {
	if len(ns) == 1 && ns[0] == seal.AllNamespaces {
		return "every namespace"
	}
	return "namespaces " + strings.Join(ns, ",")
}

// authorizeInstaller authorizes the installing user's identity for every
// namespace (docs/security.md "Keys and their rotation"), unless its key is
// already authorized for all of them.
func authorizeInstaller(ctx context.Context, c common, log io.Writer) error {
	s, err := c.sealer(true, log)
	if err != nil {
		return err
	}
	cl, err := c.cluster()
	if err != nil {
		return err
	}
	rep, err := ly.DescribeSealers(ctx, cl, s)
	if err != nil {
		return err
	}
	for _, e := range rep.Sealers {
		if e.Mine && slices.Contains(e.Namespaces, seal.AllNamespaces) {
			fmt.Fprintf(log, "this ly's sealer identity (key %s) is already authorized for every namespace as %s\n", s.KeyID(), e.Name)
			return nil
		}
	}
	ch, err := ly.AuthorizeSealer(ctx, cl, ly.SealerAuthorization{Name: ly.DefaultSealerName(), Key: s.Key.Public(), Namespaces: []string{seal.AllNamespaces}})
	if err != nil {
		return fmt.Errorf("the installation succeeded, but authorizing this ly's sealer identity (key %s) failed, so the cluster will refuse the templates it seals: %w; fix that and run `ly cluster authorize-sealer NAME --self --namespaces '*'`", s.KeyID(), err)
	}
	fmt.Fprintf(log, "authorized this ly's sealer identity %s (key %s) for every namespace in %s\n", ch.Name, ch.KeyID, ch.ConfigMap)
	return nil
}

// description is `ly cluster describe --output json`.
type description struct {
	*ly.Installation
	Sealers *ly.SealersReport `json:"sealerIdentities"`
}

func clusterDescribe(ctx context.Context, c common, stdout, stderr io.Writer) error {
	cl, err := c.cluster()
	if err != nil {
		return err
	}
	in, err := cl.Describe(ctx)
	if err != nil {
		return err
	}
	// Describing never creates an identity.
	path, err := ly.SealerKeyPath(c.sealerKey)
	if err != nil {
		return err
	}
	mine, err := ly.LoadSealer(path, false)
	if err != nil {
		mine = nil
		fmt.Fprintf(stderr, "note: this ly has no usable sealer identity: %v\n", err)
	}
	rep, err := ly.DescribeSealers(ctx, cl, mine)
	if err != nil {
		return err
	}
	if c.output == ly.OutputJSON {
		return json.NewEncoder(stdout).Encode(description{in, rep})
	}
	fmt.Fprintf(stdout, "context:             %s\nnamespace:           %s\nregistry:            %s\ntemplate repository: %s\nbackend strategy:    %s\nfleet key id:        %s\nfleet public key:\n%s", in.Context, in.Namespace, in.Registry, in.TemplateRepository, in.BackendStrategy, in.FleetKeyID, in.FleetPublicKeyPEM)
	printSealers(stdout, cl.LampyrNamespace, c.namespace, mine, rep)
	return nil
}

func printSealers(w io.Writer, lampyrNS, ns string, mine *ly.Sealer, rep *ly.SealersReport) {
	fmt.Fprintf(w, "sealer identities (ConfigMap %s/%s):\n", lampyrNS, contract.SealersConfigMap)
	if rep.Problems != "" {
		fmt.Fprintf(w, "  ignored by the grant controller: %s\n", rep.Problems)
	}
	if rep.Note != "" {
		fmt.Fprintf(w, "  %s\n", rep.Note)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range rep.Sealers {
		me := ""
		if s.Mine {
			me = "\t(this ly)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s%s\n", s.Name, s.KeyID[:16], namespacesText(s.Namespaces), me)
	}
	tw.Flush()
	switch {
	case mine == nil:
		fmt.Fprintf(w, "this ly: no sealer identity yet (ly sealer show or the first ly deploy creates one)\n")
	case !rep.Readable:
		fmt.Fprintf(w, "this ly: key %s (%s)\n", mine.KeyID(), mine.Path)
	default:
		authorized, _ := rep.Authorized(ns)
		switch {
		case authorized:
			fmt.Fprintf(w, "this ly: key %s, authorized for namespace %s\n", mine.KeyID(), ns)
		case mineListed(rep):
			fmt.Fprintf(w, "this ly: key %s, not authorized for namespace %s: an administrator extends its entry with `ly cluster authorize-sealer NAME --public-key %s --namespaces ...`\n", mine.KeyID(), ns, mine.PublicKey())
		default:
			fmt.Fprintf(w, "this ly: key %s, not authorized: an administrator runs `%s`\n", mine.KeyID(), mine.AuthorizeCommand(ly.DefaultSealerName(), ns))
		}
	}
}

func mineListed(rep *ly.SealersReport) bool {
	for _, s := range rep.Sealers {
		if s.Mine {
			return true
		}
	}
	return false
}

// sealerShow is `ly sealer show`.
func sealerShow(c common, stdout, stderr io.Writer) error {
	s, err := c.sealer(true, stderr)
	if err != nil {
		return err
	}
	cmd := s.AuthorizeCommand(ly.DefaultSealerName(), c.namespace)
	if c.output == ly.OutputJSON {
		return json.NewEncoder(stdout).Encode(map[string]string{
			"path": s.Path, "keyID": s.KeyID(), "publicKey": s.PublicKey(),
			"publicKeyPEM": string(seal.MarshalSealerPublicKey(s.Key.Public())), "authorizeCommand": cmd,
		})
	}
	fmt.Fprintf(stdout, "sealer identity: %s\nkey id:          %s\npublic key:      %s\n", s.Path, s.KeyID(), s.PublicKey())
	fmt.Fprintf(stdout, "An administrator authorizes it for namespace %s (another with -n, several as a,b, all as '*') with:\n  %s\n", c.namespace, cmd)
	return nil
}
