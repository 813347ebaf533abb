package bench

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"lampyr.dev/serving/clusters/e2eutil"
	"lampyr.dev/serving/impl/contract"
)

// timeline records when each step of a Lampyr Revision's way to Ready was
// first observed (polled every 100 ms from the moment the Service was
// applied): the split issue 11 asks for where apply -> Ready is slow.
type timeline struct {
	mu    sync.Mutex
	t0    time.Time
	first map[string]time.Duration
}

// Milestones in the order a Revision normally passes them.
var milestones = []string{
	"Revision created", "grant Admitted", "Home Pod scheduled", "Home Pod started",
	"grant HomeReady", "Revision ResourcesAvailable", "Revision Ready",
}

func (t *timeline) see(what string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.first[what]; !ok {
		t.first[what] = time.Since(t.t0)
	}
}

// watchRevision polls rev's Revision, CapacityGrant and Home Pod until
// stop is closed, and returns what it saw.
func watchRevision(ctx context.Context, c *e2eutil.Clients, rev string, stop <-chan struct{}) *timeline {
	t := &timeline{t0: time.Now(), first: map[string]time.Duration{}}
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
			if g, err := c.Dynamic.Resource(contract.CapacityGrants).Namespace(ns).Get(ctx, rev, metav1.GetOptions{}); err == nil {
				if s, _, _ := e2eutil.Condition(g, "Admitted"); s == "True" {
					t.see("grant Admitted")
				}
				if s, _, _ := e2eutil.Condition(g, "HomeReady"); s == "True" {
					t.see("grant HomeReady")
				}
			}
			if pods, err := e2eutil.HomePods(ctx, c, ns, rev); err == nil {
				for _, p := range pods.Items {
					for _, cond := range p.Status.Conditions {
						if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionTrue {
							t.see("Home Pod scheduled")
						}
					}
					for _, cs := range p.Status.ContainerStatuses {
						if cs.State.Running != nil {
							t.see("Home Pod started")
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

// timelineRows are the median, over Revisions, of when each milestone was
// first seen after the apply.
func timelineRows(ts []*timeline) []Row {
	var rows []Row
	for _, m := range milestones {
		var at []time.Duration
		for _, t := range ts {
			t.mu.Lock()
			if d, ok := t.first[m]; ok {
				at = append(at, d)
			}
			t.mu.Unlock()
		}
		if len(at) == 0 {
			rows = append(rows, Row{Group: "Lampyr apply -> Ready", Metric: m, Note: "never observed"})
			continue
		}
		sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
		rows = append(rows, Row{Group: "Lampyr apply -> Ready", Metric: m + " (median after apply)", Unit: "ms", Lampyr: ms(at[len(at)/2]),
			Note: fmt.Sprintf("%d of %d Revisions", len(at), len(ts))})
	}
	return rows
}
