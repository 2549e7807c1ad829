package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// churn keeps workers allocating and releasing pods on random nodes, as a
// steady stream of pod starts and stops: create the pod, ADD (retried, at a
// random running replica), DEL, delete the pod.
type churn struct {
	allocs, lost, releaseFailures atomic.Int64
	cancel                        context.CancelFunc
	wg                            sync.WaitGroup
	mu                            sync.Mutex
	lastErr                       string
}

// startChurn starts workers over nodes; hold pods are kept per worker
// before they are released together (1: release at once).
func (e *env) startChurn(ctx context.Context, workers int, nodes func() []string, hold int) *churn {
	ctx, cancel := context.WithCancel(ctx)
	c := &churn{cancel: cancel}
	target := e.randomTarget()
	for w := range workers {
		c.wg.Go(func() {
			rnd := newRand()
			type held struct {
				p       pod
				cid, ip string
			}
			var mine []held
			releaseAll := func() {
				for _, h := range mine {
					// The releases finish even when the churn stops.
					if err := e.drv.release(context.WithoutCancel(ctx), target, h.p, h.cid, h.ip, time.Minute); err != nil {
						c.releaseFailures.Add(1)
						c.setErr(err)
					}
					_ = e.drv.deletePods(context.WithoutCancel(ctx), []pod{h.p}, 1)
				}
				mine = mine[:0]
			}
			defer releaseAll()
			for ctx.Err() == nil {
				ns := nodes()
				if len(ns) == 0 {
					sleep(ctx, 200*time.Millisecond)
					continue
				}
				p := pod{
					name: fmt.Sprintf("churn-%d-%d", w, e.drv.seq.Add(1)),
					node: ns[rnd.IntN(len(ns))],
				}
				if err := retry(ctx, 30*time.Second, func() error { return e.drv.createPod(ctx, p) }); err != nil {
					continue
				}
				cid := e.drv.containerID()
				ip, err := e.drv.allocateRetry(context.WithoutCancel(ctx), target, p, cid, 90*time.Second)
				if err != nil {
					c.lost.Add(1)
					c.setErr(err)
					_ = e.drv.deletePods(context.WithoutCancel(ctx), []pod{p}, 1)
					continue
				}
				c.allocs.Add(1)
				mine = append(mine, held{p, cid, ip})
				if len(mine) >= hold {
					releaseAll()
				}
			}
		})
	}
	return c
}

func (c *churn) setErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastErr = err.Error()
}

func (c *churn) stop() {
	c.cancel()
	c.wg.Wait()
}
