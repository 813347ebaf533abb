package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/pkg/env"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"lampyr.dev/serving/clusters"
	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/install"
	"lampyr.dev/serving/impl/install/networking"
)

// ConnectExternals records a Target for each declared cluster that names
// an External installation, then checks every one (Preflight, all at
// once) and fails naming, per target, everything that is missing: a run
// on clusters someone else keeps must stop in seconds, not after a build
// and a 4-minute wait for a Service that cannot become Ready.
func ConnectExternals(cs ...Cluster) env.Func {
	return func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		r, err := runFrom(ctx)
		if err != nil {
			return ctx, err
		}
		var ts []*Target
		var errs []error
		for _, c := range cs {
			t, err := r.externalTarget(c)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			ts = append(ts, t)
		}
		var wg sync.WaitGroup
		checks := make([]error, len(ts))
		for i, t := range ts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				checks[i] = r.log.Step(fmt.Sprintf("Checking %s (%s profile, external): API server, Knative, gateway %s, registry %s", t.Name, orNone(t.Profile), t.Gateway, orNone(t.Registry)), func() error {
					return Preflight(ctx, t, PreflightOptions{})
				})
			}()
		}
		wg.Wait()
		// Only a target that passed is recorded: a refused one holds
		// nothing of this run's to dump or clean up.
		for i, t := range ts {
			if checks[i] != nil {
				errs = append(errs, checks[i])
				continue
			}
			targetsFrom(ctx).put(t)
		}
		if len(errs) > 0 {
			return ctx, fmt.Errorf("refusing to run on the external targets:\n%w", errors.Join(errs...))
		}
		return ctx, nil
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// externalTarget is c's Target: its kubeconfig (a file holding the stated
// context alone when one is stated, so that every client and `ly` use that
// context), clients, gateway, registry and provider.
func (r *run) externalTarget(c Cluster) (*Target, error) {
	ext := c.External
	switch {
	case ext.Kubeconfig == "":
		return nil, fmt.Errorf("target %s: no kubeconfig", c.Name)
	case ext.Gateway == "":
		return nil, fmt.Errorf("target %s: no gateway: state the Knative gateway's http://host:port", c.Name)
	}
	kc := ext.Kubeconfig
	if ext.Context != "" {
		r.mu.Lock()
		dir, err := r.tempDir()
		r.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if kc, err = ContextKubeconfig(ext.Kubeconfig, ext.Context, filepath.Join(dir, c.Name+".kubeconfig")); err != nil {
			return nil, fmt.Errorf("target %s: %w", c.Name, err)
		}
	}
	t := &Target{
		Name: c.Name, Profile: c.Profile, Kubeconfig: kc, Source: ext.Kubeconfig, Context: ext.Context, Gateway: strings.TrimSuffix(ext.Gateway, "/"),
		Registry: ext.Registry, Push: ext.Push, Provider: ext.Provider,
		Config: envconf.NewWithKubeConfig(kc), External: true,
	}
	if t.Provider != "" {
		p, err := networking.Get(t.Provider)
		if err != nil {
			return nil, fmt.Errorf("target %s: %w", c.Name, err)
		}
		t.Provider = p.Name()
	}
	var err error
	if t.Clients, err = e2eutil.NewClients(kc); err != nil {
		return nil, fmt.Errorf("target %s: kubeconfig %s: %w", c.Name, ext.Kubeconfig, err)
	}
	return t, nil
}

// ContextKubeconfig writes to out a kubeconfig holding only context of
// the kubeconfig at path, its credentials embedded (the file is private to
// the run and removed with it).
func ContextKubeconfig(path, context, out string) (string, error) {
	cfg, err := (&clientcmd.ClientConfigLoadingRules{ExplicitPath: path}).Load()
	if err != nil {
		return "", fmt.Errorf("reading kubeconfig %s: %w", path, err)
	}
	if _, ok := cfg.Contexts[context]; !ok {
		var names []string
		for n := range cfg.Contexts {
			names = append(names, n)
		}
		return "", fmt.Errorf("kubeconfig %s has no context %q (contexts: %s)", path, context, strings.Join(names, ", "))
	}
	cfg.CurrentContext = context
	if err := clientcmdMinify(cfg); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
		return "", err
	}
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		return "", err
	}
	return out, os.Chmod(out, 0o600)
}

// PreflightOptions tune Preflight.
type PreflightOptions struct {
	// Timeout bounds each check (default 15 s); the pull check waits up
	// to PullTimeout (default 90 s) for the node to decide.
	Timeout, PullTimeout time.Duration
	// SkipPull leaves out the check that the cluster pulls from the
	// registry (only that the host pushes to it).
	SkipPull bool
}

var crds = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Preflight checks that an external target can run a suite and returns
// one error naming the target and everything missing: an API server that
// answers, Knative Serving (for a profile), Lampyr (lampyr profile: the
// CapacityGrant CRD and the lampyr-system namespace), a gateway that
// accepts a connection, and, when the target names a registry, one this
// host pushes a tiny image to and (stock profile) the cluster pulls it
// from.
func Preflight(ctx context.Context, t *Target, o PreflightOptions) error {
	if o.Timeout == 0 {
		o.Timeout = 15 * time.Second
	}
	if o.PullTimeout == 0 {
		o.PullTimeout = 90 * time.Second
	}
	var missing []string
	miss := func(format string, a ...any) { missing = append(missing, fmt.Sprintf(format, a...)) }
	cctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()

	apiUp := true
	if _, err := serverVersion(cctx, t); err != nil {
		apiUp = false
		miss("no API server answering: %v", err)
	}
	if apiUp && t.Profile != "" {
		if _, err := t.Clients.Dynamic.Resource(crds).Get(cctx, "services.serving.knative.dev", metav1.GetOptions{}); err != nil {
			miss("no Knative Serving: CustomResourceDefinition services.serving.knative.dev: %v", err)
		}
	}
	if apiUp && t.Profile == clusters.ProfileLampyr {
		grants := contract.CapacityGrants.Resource + "." + contract.CapacityGrants.Group
		if _, err := t.Clients.Dynamic.Resource(crds).Get(cctx, grants, metav1.GetOptions{}); err != nil {
			miss("no Lampyr: CustomResourceDefinition %s: %v (install Lampyr with `ly cluster install --context ...`)", grants, err)
		}
		if _, err := t.Clients.Kube.CoreV1().Namespaces().Get(cctx, contract.SystemNamespace, metav1.GetOptions{}); err != nil {
			miss("no Lampyr: namespace %s: %v", contract.SystemNamespace, err)
		}
	}
	if apiUp && t.Provider == "" && t.Profile != "" {
		if p, err := install.InstalledProvider(cctx, t.Clients.Install()); err == nil && p != nil {
			t.Provider = p.Name()
		}
	}
	if err := DialGateway(cctx, t.Gateway); err != nil {
		miss("no reachable gateway: %v", err)
	}
	if t.Registry != "" {
		ref, err := PushProbe(cctx, t)
		switch {
		case err != nil:
			miss("no registry access: %v", err)
		case apiUp && !o.SkipPull && t.Profile == clusters.ProfileStock:
			pctx, cancel := context.WithTimeout(ctx, o.PullTimeout)
			defer cancel()
			if err := CheckPull(pctx, t, ref); err != nil {
				miss("no registry access from the cluster: %v", err)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("target %s (profile %s, %s): %s", t.Name, orNone(t.Profile), t.Address(), strings.Join(missing, "; "))
}

func serverVersion(ctx context.Context, t *Target) (string, error) {
	type res struct {
		v   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		v, err := t.Clients.Kube.Discovery().ServerVersion()
		if err != nil {
			ch <- res{"", err}
			return
		}
		ch <- res{v.GitVersion, nil}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// DialGateway opens (and closes) a TCP connection to a gateway given as
// http://host:port.
func DialGateway(ctx context.Context, gateway string) error {
	u, err := url.Parse(gateway)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("gateway %q: want http://host:port", gateway)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", host)
	if err != nil {
		return fmt.Errorf("dialling %s (%s): %w", host, gateway, err)
	}
	return conn.Close()
}

// PreflightRepo is the repository of the tiny image Preflight pushes.
const PreflightRepo = "lampyr-preflight/tiny"

// PushProbe pushes a tiny image (one 7-byte layer, always the same digest)
// to t's push address and returns its reference as the cluster names it.
func PushProbe(ctx context.Context, t *Target) (string, error) {
	push := t.Push
	if push == "" {
		push = t.Registry
	}
	layer, err := crane.Layer(map[string][]byte{"lampyr-preflight": []byte("lampyr\n")})
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}
	tag, err := name.NewTag(push + "/" + PreflightRepo + ":preflight")
	if err != nil {
		return "", fmt.Errorf("registry %q: %w", push, err)
	}
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, ResponseHeaderTimeout: 10 * time.Second}
	if err := remote.Write(tag, img, remote.WithContext(ctx), remote.WithTransport(tr)); err != nil {
		return "", fmt.Errorf("pushing a tiny image to %s: %w", tag, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return t.Registry + "/" + PreflightRepo + "@" + d.String(), nil
}

// PreflightNamespace prefixes the namespace CheckPull's Pod runs in (one
// per check: checks of targets on the same cluster run side by side).
const PreflightNamespace = "lampyr-preflight-"

// CheckPull has the cluster pull ref: a Pod (Pod Security restricted,
// never started: its command does not exist) that the node either pulls
// the image for (its container status gets an imageID, or the container
// fails to start) or reports a pull error for. The Pod's namespace is
// deleted after.
func CheckPull(ctx context.Context, t *Target, ref string) error {
	kube := t.Clients.Kube
	ns := PreflightNamespace + rand.String(5)
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s for the pull check: %w", ns, err)
	}
	defer func() {
		// Not waited for: the namespace goes with its Pod.
		_ = kube.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns, metav1.DeleteOptions{})
	}()
	created, err := kube.CoreV1().Pods(ns).Create(ctx, pullPod(ref), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the pull-check Pod: %w", err)
	}
	for {
		p, err := kube.CoreV1().Pods(ns).Get(ctx, created.Name, metav1.GetOptions{})
		if err == nil {
			if done, perr := PullVerdict(p); done {
				if perr != nil {
					return fmt.Errorf("%s: %w", ref, perr)
				}
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cluster had not pulled %s after waiting (Pod %s/%s): %w", ref, ns, created.Name, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

func pullPod(ref string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pull", Labels: map[string]string{"app.kubernetes.io/name": "lampyr-preflight"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(int64(65532)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "pull", Image: ref, Command: []string{"/lampyr-preflight-never-runs"},
				ImagePullPolicy: corev1.PullAlways,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// pullFailures are the waiting reasons a kubelet gives an image it could
// not pull.
var pullFailures = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true, "ErrImageNeverPull": true, "RegistryUnavailable": true}

// PullVerdict reads the pull-check Pod: done once the node decided, with
// the pull's error if it failed.
func PullVerdict(p *corev1.Pod) (done bool, err error) {
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil && pullFailures[cs.State.Waiting.Reason]:
			return true, fmt.Errorf("the node could not pull it: %s: %s", cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.ImageID != "", cs.State.Running != nil, cs.State.Terminated != nil:
			return true, nil
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "ContainerCreating" && cs.State.Waiting.Reason != "PodInitializing":
			// CreateContainerError, RunContainerError...: the image is
			// there, the command is not (as intended).
			return true, nil
		}
	}
	if p.Status.Phase == corev1.PodFailed {
		return true, fmt.Errorf("the pull-check Pod failed: %s %s", p.Status.Reason, p.Status.Message)
	}
	return false, nil
}

// clientcmdMinify keeps only cfg's current context (and its cluster and
// user) and embeds the files they name.
func clientcmdMinify(cfg *clientcmdapi.Config) error {
	if err := clientcmdapi.MinifyConfig(cfg); err != nil {
		return err
	}
	return clientcmdapi.FlattenConfig(cfg)
}
