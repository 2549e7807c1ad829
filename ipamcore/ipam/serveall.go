package ipam

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// ServeAllNodes serves every BCC node of the cluster (providerID cce://…) and
// stops serving deleted ones. It is the owned-set policy of a single replica;
// the shard layer replaces it with the nodes the ring and leases assign. It
// blocks until ctx ends.
func (i *IPAM) ServeAllNodes(ctx context.Context) error {
	select {
	case <-i.ready:
	case <-ctx.Done():
		return nil
	}
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer queue.ShutDown()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	reg, err := i.kubeInformers.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		DeleteFunc: enqueue,
		UpdateFunc: func(old, cur any) {
			// Only a providerID appearing matters (nodes register first).
			if old.(*corev1.Node).Spec.ProviderID != cur.(*corev1.Node).Spec.ProviderID {
				enqueue(cur)
			}
		},
	})
	if err != nil {
		return err
	}
	defer func() { _ = i.kubeInformers.Core().V1().Nodes().Informer().RemoveEventHandler(reg) }()

	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for {
		name, shutdown := queue.Get()
		if shutdown {
			return nil
		}
		err := i.syncServed(ctx, name)
		if err != nil && ctx.Err() == nil {
			i.log.Warn("serving node failed; will retry", "node", name, "err", err)
			queue.AddRateLimited(name)
		} else {
			queue.Forget(name)
		}
		queue.Done(name)
	}
}

func (i *IPAM) syncServed(ctx context.Context, name string) error {
	n, err := i.nodes.Get(name)
	if err != nil || n.DeletionTimestamp != nil || !strings.HasPrefix(n.Spec.ProviderID, "cce://") {
		i.StopServingNode(name)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return i.ServeNode(ctx, name)
}
