package fleet

import (
	"context"
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServeMetricsBehind makes the replicas' metrics ports the endpoints of the
// Service svc in ns, as a cluster would for replica pods: per replica the
// Pod that pod(r) returns (never scheduled: no kubelet runs it) with the
// replica's address in its status, and the EndpointSlice the endpointslice
// controller would write (none runs here). The API server's service proxy
// then reaches the replicas: it accepts an endpoint only with a target Pod
// whose status names the address, and never a loopback one (Options.NetNS
// gives the replicas addresses it accepts). The objects stay with ns.
func (f *Fleet) ServeMetricsBehind(ctx context.Context, ns, svc string, pod func(r *Replica) *corev1.Pod) error {
	var endpoints []discoveryv1.Endpoint
	for _, r := range f.Replicas() {
		host, _, err := net.SplitHostPort(r.MetricsAddr())
		if err != nil {
			return err
		}
		p, err := f.Kube.CoreV1().Pods(ns).Create(ctx, pod(r), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("pod of replica %d: %w", r.Index(), err)
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP, p.Status.PodIPs = host, []corev1.PodIP{{IP: host}}
		if _, err := f.Kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("status of pod %s: %w", p.Name, err)
		}
		endpoints = append(endpoints, discoveryv1.Endpoint{
			Addresses:  []string{host},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: p.Name, UID: p.UID},
		})
	}
	_, err := f.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-replicas", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   endpoints,
		Ports: []discoveryv1.EndpointPort{{Name: new("metrics"), Port: new(int32(9998)),
			Protocol: new(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{})
	return err
}
