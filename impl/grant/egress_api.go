package grant

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"knative.dev/pkg/logging"

	"lampyr.dev/serving/impl/apis/fiberd/v1alpha1"
	fiberdlisters "lampyr.dev/serving/impl/client/listers/fiberd/v1alpha1"
	"lampyr.dev/serving/impl/contract"
	"lampyr.dev/serving/impl/contract/lampyrconfig"
	"lampyr.dev/serving/impl/grant/resources"
	"lampyr.dev/serving/impl/trust/signedgrant"
)

// The egress API (DESIGN issue 31 §2): a Home's fiberd, on its fibers'
// first outbound connection, POSTs contract.EgressAPIPath with its signed
// grant as bearer; the grant controller makes sure the grant's namespace
// has its egress Pod, Service and NetworkPolicy (egresspod.go), waits for
// the Pod to be Ready and answers its address. Only lampyr-homes reaches
// the port (impl/config/networkpolicy), and only a grant this controller
// signed, unexpired, of an admitted CapacityGrant, is served: nobody else
// can make Pods appear in a tenant's namespace.

// Egress API bounds.
const (
	// egressReadyTimeout bounds the wait for a new egress Pod.
	egressReadyTimeout = 30 * time.Second
	// egressPollEvery is how often the Pod is looked at meanwhile.
	egressPollEvery = 500 * time.Millisecond
	// maxEgressRequests bounds requests served at once: a Home that
	// cannot reach its proxy asks again at most once a second, but
	// every Home of every namespace may.
	maxEgressRequests = 32
)

type egressAPIAddrKey struct{}

// WithEgressAPI makes the grant controller serve the egress API on addr
// (host:port; impl/cmd/grant-controller --egress-api-listen).
func WithEgressAPI(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, egressAPIAddrKey{}, addr)
}

func egressAPIAddr(ctx context.Context) string {
	s, _ := ctx.Value(egressAPIAddrKey{}).(string)
	return s
}

// EgressAPI serves the egress API.
type EgressAPI struct {
	kube           kubernetes.Interface
	grants         fiberdlisters.CapacityGrantLister
	key            ed25519.PublicKey
	keyPEM         []byte
	config         func(context.Context) (*lampyrconfig.Config, error)
	homesNamespace string
	now            func() time.Time
	readyTimeout   time.Duration
	pollEvery      time.Duration

	busy chan struct{}
	// nsLocks serialise the work per namespace: Homes of one namespace
	// asking together wait for the same Pod.
	nsMu    sync.Mutex
	nsLocks map[string]*sync.Mutex
}

// newEgressAPI serves the egress API with the Reconciler's clients, keys
// and configuration.
func newEgressAPI(r *Reconciler) *EgressAPI {
	return &EgressAPI{
		kube:           r.kube,
		grants:         r.grants,
		key:            r.keys.Signing.Public().(ed25519.PublicKey),
		keyPEM:         r.keys.SigningPubPEM,
		config:         r.config,
		homesNamespace: r.homesNamespace,
		now:            r.now,
		readyTimeout:   egressReadyTimeout,
		pollEvery:      egressPollEvery,
		busy:           make(chan struct{}, maxEgressRequests),
		nsLocks:        map[string]*sync.Mutex{},
	}
}

// startEgressAPI serves a on the address WithEgressAPI put in ctx, if any,
// until ctx ends. A listener that cannot open is logged: Homes then fail
// their fibers' outbound connections, and nothing else.
func startEgressAPI(ctx context.Context, a *EgressAPI) {
	addr := egressAPIAddr(ctx)
	if addr == "" {
		return
	}
	logger := logging.FromContext(ctx)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		logger.Errorw("Fibers' egress API not served: their outbound connections fail until it is", "address", addr, "error", err)
		return
	}
	srv := &http.Server{
		Handler:           a,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    32 << 10,
		// The answer may wait for a new Pod to be Ready.
		WriteTimeout: a.readyTimeout + 15*time.Second,
		BaseContext:  func(net.Listener) context.Context { return ctx },
	}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		logger.Infow("Serving the fibers' egress API", "address", ln.Addr().String(), "path", contract.EgressAPIPath)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Errorw("Fibers' egress API stopped", "error", err)
		}
	}()
}

// egressAnswer is the API's 200 answer (package proxy EgressResponse).
type egressAnswer struct {
	Endpoint string `json:"endpoint"`
}

// ServeHTTP implements http.Handler. Refusals name what to fix, never an
// address or another namespace's object.
func (a *EgressAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != contract.EgressAPIPath {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	select {
	case a.busy <- struct{}{}:
		defer func() { <-a.busy }()
	default:
		http.Error(w, "the egress API is busy; ask again shortly", http.StatusServiceUnavailable)
		return
	}
	g, code, msg := a.authorize(r)
	if code != 0 {
		http.Error(w, msg, code)
		return
	}
	logger := logging.FromContext(r.Context()).With("namespace", g.Namespace, "grant", g.Name)
	cfg, err := a.config(r.Context())
	if err != nil {
		logger.Errorw("Reading config-lampyr for the egress API", "error", err)
		http.Error(w, "the grant controller cannot read its configuration", http.StatusInternalServerError)
		return
	}
	if cfg.Egress != lampyrconfig.EgressCluster {
		http.Error(w, fmt.Sprintf("%s in ConfigMap %s is %q: fibers do not leave through egress Pods", lampyrconfig.KeyFiberEgress, contract.ConfigMapName, cfg.Egress), http.StatusConflict)
		return
	}
	if reason, msg := checkImages(cfg); reason != "" {
		http.Error(w, msg, http.StatusConflict)
		return
	}
	mu := a.lockNamespace(g.Namespace)
	mu.Lock()
	defer mu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), a.readyTimeout)
	defer cancel()
	ep, err := a.ensureEgress(ctx, g.Namespace, cfg)
	if err != nil {
		logger.Warnw("Egress Pod not available", "error", err)
		code := http.StatusServiceUnavailable
		var ee *egressError
		if errors.As(err, &ee) {
			code = ee.code
		}
		http.Error(w, err.Error(), code)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(egressAnswer{Endpoint: ep})
}

// authorize finds the CapacityGrant whose Home holds the bearer grant:
// signed by this controller, unexpired, of an existing, admitted
// CapacityGrant. code 0: found.
func (a *EgressAPI) authorize(r *http.Request) (*v1alpha1.CapacityGrant, int, string) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return nil, http.StatusUnauthorized, "the Home's signed grant is required as bearer token"
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(tok))
	if err != nil {
		return nil, http.StatusUnauthorized, "the bearer token is not base64"
	}
	c, err := signedgrant.Verify(a.key, raw, a.now())
	switch {
	case errors.Is(err, signedgrant.ErrExpired):
		return nil, http.StatusUnauthorized, "the signed grant has expired"
	case err != nil:
		return nil, http.StatusUnauthorized, "the signed grant does not verify with this grant controller's key"
	}
	gs, err := a.grants.CapacityGrants(c.Namespace).List(labels.Everything())
	if err != nil {
		return nil, http.StatusInternalServerError, "cannot list CapacityGrants"
	}
	for _, g := range gs {
		// The Home's name is the grant's identity (a renewed grant has a
		// new ID; the Home may still hold the previous one for a while).
		if resources.HomeName(g) != c.Home || g.Spec.RevisionName != c.Revision {
			continue
		}
		if g.DeletionTimestamp != nil || !g.Status.IsAdmitted() {
			return nil, http.StatusForbidden, "the CapacityGrant of this grant is not admitted"
		}
		return g, 0, ""
	}
	return nil, http.StatusForbidden, "no CapacityGrant holds this grant"
}

func (a *EgressAPI) lockNamespace(ns string) *sync.Mutex {
	a.nsMu.Lock()
	defer a.nsMu.Unlock()
	mu, ok := a.nsLocks[ns]
	if !ok {
		mu = &sync.Mutex{}
		a.nsLocks[ns] = mu
	}
	return mu
}
