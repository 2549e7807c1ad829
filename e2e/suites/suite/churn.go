package suite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/e2e/fleet"
)

// ChurnLabel is on every pod a Churn without a Name creates.
const ChurnLabel = "app=churn"

// Churn keeps creating and deleting bare pods in one namespace, between
// Min and Max pods, in a seeded order, until stopped.
type Churn struct {
	Namespace string
	// Name labels the pods app=<Name> and prefixes their names, so that two
	// churns can share a namespace. Defaults to "churn" (ChurnLabel).
	Name string
	// PSTS, when set, makes the pods that PodSubnetTopologySpread's, as its
	// mutating webhook would (PSTSMutate).
	PSTS     string
	Min, Max int
	// Period between two steps; each step creates or deletes 1..Batch pods.
	Period time.Duration
	Batch  int

	created, deleted, errors atomic.Int64
	stop                     context.CancelFunc
	wg                       sync.WaitGroup
}

// ChurnStats are a churn's counters.
type ChurnStats struct{ Created, Deleted, Errors int64 }

func (s ChurnStats) String() string {
	return fmt.Sprintf("%d pods created, %d deleted, %d API errors", s.Created, s.Deleted, s.Errors)
}

// StartChurn starts churning with a seeded random source; Stop ends it.
// Deleted pods have a 2s grace period, so the kubelet simulator sees them
// terminating and releases their IPs first, as a kubelet would.
func StartChurn(t testing.TB, f *fleet.Fleet, c *Churn, seed uint64) {
	t.Helper()
	if c.Batch == 0 {
		c.Batch = 5
	}
	if c.Name == "" {
		c.Name = "churn"
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	spec := PodSpec(f)
	spec.TerminationGracePeriodSeconds = ptr.To[int64](2)
	meta := metav1.ObjectMeta{Labels: map[string]string{"app": c.Name}}
	if c.PSTS != "" {
		PSTSMutate(&meta, &spec, c.PSTS)
	}
	pods := f.Kube.CoreV1().Pods(c.Namespace)
	var live []string
	seq := 0
	c.wg.Go(func() {
		t := time.NewTicker(c.Period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n := 1 + rng.IntN(c.Batch)
			grow := len(live) < c.Min || (len(live) < c.Max && rng.IntN(2) == 0)
			for range n {
				if grow && len(live) < c.Max {
					name := fmt.Sprintf("%s-%05d", c.Name, seq)
					seq++
					m := *meta.DeepCopy()
					m.Name = name
					_, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: m, Spec: *spec.DeepCopy()}, metav1.CreateOptions{})
					if err != nil {
						c.errors.Add(1)
						continue
					}
					live = append(live, name)
					c.created.Add(1)
				} else if !grow && len(live) > c.Min {
					k := rng.IntN(len(live))
					name := live[k]
					err := pods.Delete(ctx, name, metav1.DeleteOptions{})
					if err != nil && !apierrors.IsNotFound(err) {
						c.errors.Add(1)
						continue
					}
					live = append(live[:k], live[k+1:]...)
					c.deleted.Add(1)
				}
			}
		}
	})
	t.Cleanup(func() { c.Stop() })
}

// Stop ends the churn and waits for its goroutine; it returns the counters.
func (c *Churn) Stop() ChurnStats {
	if c.stop != nil {
		c.stop()
	}
	c.wg.Wait()
	return c.Stats()
}

// Stats returns the counters so far.
func (c *Churn) Stats() ChurnStats {
	return ChurnStats{
		Created: c.created.Load(),
		Deleted: c.deleted.Load(),
		Errors:  c.errors.Load(),
	}
}

// Selector selects the churn's pods (after StartChurn).
func (c *Churn) Selector() string { return "app=" + c.Name }

// WaitSettled waits until every churn pod left in the namespace is Running
// with an IP (none terminating), and returns them.
func WaitSettled(ctx context.Context, t testing.TB, f *fleet.Fleet, ns string) []corev1.Pod {
	t.Helper()
	return WaitSettledSelector(ctx, t, f, ns, ChurnLabel)
}

// WaitSettledSelector is WaitSettled for the pods selector selects (a
// named Churn's Selector).
func WaitSettledSelector(ctx context.Context, t testing.TB, f *fleet.Fleet, ns, selector string) []corev1.Pod {
	t.Helper()
	var n int
	for {
		list, err := f.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil {
			n = 0
			for i := range list.Items {
				if list.Items[i].DeletionTimestamp == nil {
					n++
				}
			}
			if n == len(list.Items) {
				return WaitPods(ctx, t, f.Kube, ns, selector, n)
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("churn pods did not settle: %v", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}
