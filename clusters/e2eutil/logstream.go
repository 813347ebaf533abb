package e2eutil

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StreamLogs follows the logs of every container of every Pod in the
// namespaces, as Pods appear, into dir/<namespace>/<pod>_<container>_<restart>_<uid>.log
// (timestamped lines; <pod> is followed by the first 8 characters of its
// UID), until stop is called or ctx ends. A Pod deleted
// while it runs keeps its logs here, where `kubectl logs` and the dump after
// a failure lose them with the Pod: the operations suite traces a failed
// request to the replica that answered it, and the replicas that answered
// during a roll are gone by the end of the scenario. stop waits until every
// stream has ended and its file is closed.
func StreamLogs(ctx context.Context, c *Clients, dir string, namespaces ...string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	following := map[string]bool{}
	follow := func(ns string, p corev1.Pod, st corev1.ContainerStatus) {
		key := fmt.Sprintf("%s/%s/%s/%d", ns, p.UID, st.Name, st.RestartCount)
		mu.Lock()
		if following[key] {
			mu.Unlock()
			return
		}
		following[key] = true
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The UID keeps apart Pods that reuse a name (a Home moved back
			// to its own name): os.Create would truncate the first one's.
			path := filepath.Join(dir, ns, fmt.Sprintf("%s_%s_%d_%s.log", p.Name, st.Name, st.RestartCount, string(p.UID)[:min(8, len(p.UID))]))
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return
			}
			f, err := os.Create(path)
			if err != nil {
				return
			}
			defer f.Close()
			s, err := c.Kube.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: st.Name, Follow: true, Timestamps: true}).Stream(ctx)
			if err != nil {
				fmt.Fprintf(f, "streaming the logs of %s/%s %s: %v\n", ns, p.Name, st.Name, err)
				return
			}
			defer s.Close()
			_, _ = io.Copy(f, s)
		}()
	}
	for _, ns := range namespaces {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if pods, err := c.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
					for _, p := range pods.Items {
						for _, st := range p.Status.ContainerStatuses {
							if st.State.Running != nil || st.State.Terminated != nil {
								follow(ns, p, st)
							}
						}
					}
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
		}()
	}
	return func() {
		cancel()
		wg.Wait()
	}
}
