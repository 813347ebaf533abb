package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/prober"
)

// Probed is one Service a suite keeps under traffic while it upgrades,
// stops or breaks something (issue 33): on cluster Cluster (a declared
// cluster's name), Service Name in Namespace, with the kinds of traffic
// it gets (default: plain requests).
type Probed struct {
	Cluster, Namespace, Name string
	Kinds                    []prober.Kind
}

// StartProber starts continuous traffic to every Service of ps through
// its cluster's gateway, counted under phase until the suite names the
// next one (Prober.Phase). The suite stops it and writes its report with
// WriteProberReport.
func StartProber(ctx context.Context, phase string, ps []Probed, opts prober.Options) (*prober.Prober, error) {
	var targets []prober.Target
	for _, p := range ps {
		t, err := TargetFrom(ctx, p.Cluster)
		if err != nil {
			return nil, err
		}
		targets = append(targets, prober.Target{
			Side:    p.Cluster,
			Service: p.Namespace + "/" + p.Name,
			Gateway: t.Gateway,
			Host:    p.Name + "." + p.Namespace + "." + clusters.Domain,
			Kinds:   p.Kinds,
		})
	}
	return prober.Start(ctx, phase, targets, opts), nil
}

// WriteProberReport writes r as name.md and name.json in the suite's
// artifacts folder and returns the Markdown's path.
func WriteProberReport(ctx context.Context, name string, r prober.Report) (string, error) {
	dir := Artifacts(ctx)
	if dir == "" {
		return "", fmt.Errorf("no artifacts folder: the suite's setup has not run")
	}
	js, err := r.JSON()
	if err != nil {
		return "", err
	}
	md := filepath.Join(dir, name+".md")
	if err := os.WriteFile(md, []byte(r.Markdown(0)), 0o644); err != nil {
		return "", err
	}
	return md, os.WriteFile(filepath.Join(dir, name+".json"), js, 0o644)
}
