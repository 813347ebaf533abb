package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
)

// timeline records when each step of a Revision's way to Ready was first
// observed (polled every 100 ms from the moment the Service was applied),
// on either side: on Lampyr the grant and its Home Pod, on stock the
// Revision's first Pod. The caller adds "Service Ready" and "first
// response".
type timeline struct {
	mu    sync.Mutex
	t0    time.Time
	first map[string]time.Duration
}

func (t *timeline) see(what string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.first[what]; !ok {
		t.first[what] = time.Since(t.t0)
	}
}

// at records a milestone the caller timed itself.
func (t *timeline) at(what string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.first[what] = d
}

// sample is the timeline as a report entry.
func (t *timeline) sample(side, svc, load string) Timeline {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := Timeline{Side: side, Service: svc, At: map[string]float64{}, Load: load}
	for k, v := range t.first {
		out.At[k] = ms(v)
	}
	return out
}

// watchRevision polls rev's Revision and Pods (on Lampyr also its
// CapacityGrant and Home Pod) until stop is closed; t0 is the apply.
func watchRevision(ctx context.Context, c *e2eutil.Clients, lampyr bool, rev string, t0 time.Time, stop <-chan struct{}) *timeline {
	t := &timeline{t0: t0, first: map[string]time.Duration{}}
	pods := func() (*corev1.PodList, error) {
		if lampyr {
			return e2eutil.HomePods(ctx, c, ns, rev)
		}
		return c.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "serving.knative.dev/revision=" + rev})
	}
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if r, err := c.Dynamic.Resource(e2eutil.Revisions).Namespace(ns).Get(ctx, rev, metav1.GetOptions{}); err == nil {
				t.see("Revision created")
				if s, _, _ := e2eutil.Condition(r, "ResourcesAvailable"); s == "True" {
					t.see("Revision ResourcesAvailable")
				}
				if s, _, _ := e2eutil.Condition(r, "Ready"); s == "True" {
					t.see("Revision Ready")
				}
			}
			if lampyr {
				if g, err := c.Dynamic.Resource(contract.CapacityGrants).Namespace(ns).Get(ctx, rev, metav1.GetOptions{}); err == nil {
					if s, _, _ := e2eutil.Condition(g, "Admitted"); s == "True" {
						t.see("grant Admitted")
					}
					if s, _, _ := e2eutil.Condition(g, "HomeReady"); s == "True" {
						t.see("grant HomeReady")
					}
				}
			}
			if l, err := pods(); err == nil {
				for _, p := range l.Items {
					for _, cond := range p.Status.Conditions {
						if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionTrue {
							t.see("Pod scheduled")
						}
						if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
							t.see("Pod Ready")
						}
					}
					for _, cs := range p.Status.ContainerStatuses {
						if cs.State.Running != nil {
							t.see("Pod started")
						}
					}
				}
			}
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return t
}

// timelineRows are the median over samples, per side, of when each
// milestone was first seen after the apply (0 where a side has no such
// milestone: the grant is Lampyr's alone). Medians taken per milestone do
// not add up; the report's per-sample table does.
func timelineRows(ts []Timeline) []Row {
	median := func(side, m string) (float64, int, int) {
		var at []float64
		n := 0
		for _, t := range ts {
			if t.Side != side {
				continue
			}
			n++
			if v, ok := t.At[m]; ok {
				at = append(at, v)
			}
		}
		if len(at) == 0 {
			return 0, 0, n
		}
		sort.Float64s(at)
		return at[(len(at)-1)/2], len(at), n
	}
	var rows []Row
	for _, m := range AllMilestones {
		st, sn, sAll := median("stock", m)
		lp, ln, lAll := median("lampyr", m)
		if sn == 0 && ln == 0 {
			continue
		}
		rows = append(rows, Row{Group: "apply -> Ready timeline (median after apply)", Metric: m, Unit: "ms", Stock: st, Lampyr: lp,
			Note: fmt.Sprintf("seen in %d/%d stock, %d/%d lampyr samples", sn, sAll, ln, lAll)})
	}
	return rows
}

// attempts counts what a poll got before its first 200, by answer.
type attempts struct {
	order []string
	n     map[string]int
}

func (a *attempts) add(code int, err error) {
	k := strconv.Itoa(code)
	if err != nil {
		k = "error"
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			k = "timeout"
		}
	}
	if a.n == nil {
		a.n = map[string]int{}
	}
	if a.n[k] == 0 {
		a.order = append(a.order, k)
	}
	a.n[k]++
}

func (a attempts) String() string {
	if len(a.order) == 0 {
		return "nothing"
	}
	parts := make([]string, 0, len(a.order))
	for _, k := range a.order {
		parts = append(parts, fmt.Sprintf("%s x%d", k, a.n[k]))
	}
	return strings.Join(parts, ", ")
}
