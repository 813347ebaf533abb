// Package clusters is the framework's entry point for Kind clusters: it
// builds the offline inputs (clusters/inputs), runs the local registry and
// creates, reuses and deletes named clusters (clusters/kindcluster).
package clusters

import (
	"context"
	"os"
	"path/filepath"

	"lampyr.dev/serving/clusters/inputs"
	"lampyr.dev/serving/clusters/kindcluster"
	"lampyr.dev/serving/clusters/progress"
)

// GatewayNodePort is the NodePort every profile's gateway listens on; it is
// published on a 127.0.0.1 port recorded in the cluster's Info.
const GatewayNodePort = 30080

// RegistryContainer is the local registry's container name.
const RegistryContainer = "lampyr-registry"

// Env ties the cache, the state directory and the registry together.
type Env struct {
	Cache    string
	StateDir string
	Log      *progress.Log
	inputs   *inputs.Result
}

// NewEnv reads LAMPYR_CACHE_DIR and LAMPYR_STATE_DIR (default
// <cache>/clusters).
func NewEnv(log *progress.Log) *Env {
	cache := inputs.CacheDir()
	state := os.Getenv("LAMPYR_STATE_DIR")
	if state == "" {
		state = filepath.Join(cache, "clusters")
	}
	return &Env{Cache: cache, StateDir: state, Log: log}
}

// Inputs builds or finds every offline input.
func (e *Env) Inputs(ctx context.Context) (*inputs.Result, error) {
	if e.inputs != nil {
		return e.inputs, nil
	}
	var res *inputs.Result
	err := e.Log.Step("Cluster inputs (cache "+e.Cache+")", func() (err error) {
		res, err = inputs.NewBuilder(e.Cache, e.Log).Build(ctx)
		return err
	})
	e.inputs = res
	return res, err
}

// Manager returns a cluster manager on the state directory, without the
// registry (enough for delete, logs, info).
func (e *Env) Manager() *kindcluster.Manager {
	return kindcluster.NewManager(e.StateDir, e.Log)
}

// Spec is the offline single-node spec for a named cluster.
func (e *Env) Spec(name, nodeImage string) kindcluster.Spec {
	return kindcluster.Spec{
		Name:              name,
		NodeImage:         nodeImage,
		Ports:             []kindcluster.PortMapping{{NodePort: GatewayNodePort}},
		CgroupV1:          !cgroupV2(),
		DisableDefaultCNI: true,
		PodSubnet:         inputs.PodSubnet,
	}
}

// Up builds the inputs and creates or reuses the named clusters in parallel,
// each connected to the local registry.
func (e *Env) Up(ctx context.Context, names []string, keep bool) ([]kindcluster.Info, error) {
	res, err := e.Inputs(ctx)
	if err != nil {
		return nil, err
	}
	m := e.Manager()
	m.Registry = &kindcluster.Registry{Container: RegistryContainer, Image: res.RegistryImage, HostPort: kindcluster.DefaultRegistryPort}
	specs := make([]kindcluster.Spec, len(names))
	for i, n := range names {
		specs[i] = e.Spec(n, res.NodeImage)
	}
	return m.Up(ctx, specs, kindcluster.UpOptions{Keep: keep})
}

func cgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}
