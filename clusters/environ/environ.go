// Package environ is the edge where the cluster framework reads its
// environment variables: the commands (lampyr-clusters, knative-conformance)
// and the suite harness (clusters/harness) call it once and hand the values
// on as explicit fields; no library below them reads the environment. The
// variables the installer reads are the product's (impl/install,
// impl/install/installenv, which `ly cluster install` reads at its own
// edge); this package reads them with the same names and defaults. Every
// variable is listed in docs/environment.md.
package environ

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/environ/inputsenv"
	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/install/installenv"
	"lampyr.dev/serving/impl/install/networking"
)

// The variables read here.
const (
	// E2E=1 runs the cluster suites (the just recipes set it); unset, they
	// skip with the recipe to run.
	E2E = "LAMPYR_E2E"
	// Keep=1 leaves clusters a suite created running (and clusters whose
	// creation failed).
	Keep = "LAMPYR_KEEP"
	// PortabilityKeep=1 is Keep for the portability suites, which also print
	// how to reach the kept Services.
	PortabilityKeep = "LAMPYR_PORTABILITY_KEEP"
	// Artifacts is the folder reports and failure dumps go to.
	Artifacts = "LAMPYR_ARTIFACTS"
	// CacheDir holds everything built from pinned versions.
	CacheDir = inputsenv.CacheDir
	// StateDir holds the clusters' kubeconfigs and records.
	StateDir = installenv.StateDir
	// EtcdOnDisk=1 keeps a test cluster's etcd on disk instead of tmpfs.
	EtcdOnDisk = "LAMPYR_ETCD_ON_DISK"
	// DebianMirror is where the node image's packages come from.
	DebianMirror = inputsenv.DebianMirror
	// Networking names the networking provider installs use.
	Networking = installenv.Networking
	// Workers is how many worker nodes each cluster a run creates gets
	// beside its control plane (default 0: one node).
	Workers = "LAMPYR_CLUSTER_WORKERS"
	// Eventing=1 adds Knative Eventing to what `lampyr-clusters up` installs.
	Eventing = "LAMPYR_EVENTING"
	// ConformanceKubeconfig and ConformanceGateway name a third party's
	// Lampyr installation for Lampyr's own conformance suite.
	ConformanceKubeconfig = "LAMPYR_CONFORMANCE_KUBECONFIG"
	ConformanceGateway    = "LAMPYR_CONFORMANCE_GATEWAY"
	// Online=1 says upstream registries are reachable (kourier may be
	// installed).
	Online = install.EnvOnline
	// ClusterInputs, ControllerManifest, GrantImage and HelperImage name
	// the lampyr profile's components when they are not built from this
	// checkout (install.LampyrSources).
	ClusterInputs      = install.EnvClusterInputs
	ControllerManifest = install.EnvControllerManifest
	GrantImage         = install.EnvGrantImage
	HelperImage        = install.EnvHelperImage
)

// Set reports whether variable k is "1".
func Set(k string) bool { return installenv.Set(k) }

// Clusters is the cluster framework's settings: the cache (LAMPYR_CACHE_DIR,
// else $XDG_CACHE_HOME/lampyr, else ~/.cache/lampyr), the state directory
// (LAMPYR_STATE_DIR, else <cache>/clusters), etcd's placement, the Debian
// mirror, LAMPYR_ONLINE and where the lampyr profile's components come
// from.
func Clusters() clusters.Settings {
	cache := installenv.Cache()
	return clusters.Settings{
		Cache:         cache,
		StateDir:      installenv.State(cache),
		EtcdOnDisk:    Set(EtcdOnDisk),
		DebianMirror:  inputsenv.Mirror(),
		Online:        Set(Online),
		Workers:       workers(),
		LampyrSources: install.LampyrSourcesFrom(os.Getenv),
	}
}

// workers is LAMPYR_CLUSTER_WORKERS: a count from 0 to 8. Anything else
// stops the run, naming the variable, rather than making a cluster of
// another shape than asked.
func workers() int {
	v := os.Getenv(Workers)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 8 {
		fmt.Fprintf(os.Stderr, "%s=%q: want a number of worker nodes from 0 to 8 (unset: one node)\n", Workers, v)
		os.Exit(2)
	}
	return n
}

// Provider is the networking provider to install (LAMPYR_NETWORKING; unset,
// networking.Default): where every suite, `lampyr-clusters up` and the
// conformance runner take it from (installenv.Provider, as `ly cluster
// install` does).
func Provider() string { return installenv.Provider(networking.Default) }

// ArtifactsDir is LAMPYR_ARTIFACTS, else _artifacts at the repository root.
func ArtifactsDir() string {
	if d := os.Getenv(Artifacts); d != "" {
		return d
	}
	return filepath.Join(clusters.RepoRoot(), "_artifacts")
}
