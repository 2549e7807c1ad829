package kubeletsim

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

func TestNewContainerID_FreshHex64(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := newContainerID()
		if len(id) != 64 || seen[id] {
			t.Fatalf("container ID %q: want 64 hex digits, never repeated", id)
		}
		for _, c := range id {
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				t.Fatalf("container ID %q is not hex", id)
			}
		}
		seen[id] = true
	}
}

func TestRunningStatus_RoundTripsSandbox(t *testing.T) {
	started := metav1.NewTime(time.Unix(100, 0))
	pod := &corev1.Pod{
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:  "a",
			Image: "img:a",
		}, {
			Name:  "b",
			Image: "img:b",
		}}},
		Status: corev1.PodStatus{
			StartTime: &started,
			QOSClass:  corev1.PodQOSBestEffort,
		},
	}
	st := runningStatus(pod, "abc", "10.0.0.9", time.Unix(200, 0))
	if st.Phase != corev1.PodRunning || st.PodIP != "10.0.0.9" || len(st.PodIPs) != 1 || st.PodIPs[0].IP != "10.0.0.9" {
		t.Fatalf("status %+v", st)
	}
	if !st.StartTime.Equal(&started) || st.QOSClass != corev1.PodQOSBestEffort {
		t.Fatalf("start time or QoS class not kept: %+v", st)
	}
	ready := map[corev1.PodConditionType]bool{}
	for _, c := range st.Conditions {
		ready[c.Type] = c.Status == corev1.ConditionTrue
	}
	for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		if !ready[c] {
			t.Errorf("condition %s not true", c)
		}
	}
	if len(st.ContainerStatuses) != 2 || st.ContainerStatuses[1].Name != "b" || st.ContainerStatuses[1].State.Running == nil ||
		!st.ContainerStatuses[1].Ready {
		t.Fatalf("container statuses %+v", st.ContainerStatuses)
	}
	pod.Status = st
	id, ip, ok := sandboxFromStatus(pod)
	if !ok || id != "abc" || ip != "10.0.0.9" {
		t.Fatalf("sandboxFromStatus = %q %q %v", id, ip, ok)
	}
	pod.Status.ContainerStatuses[0].ContainerID = "containerd://xyz"
	pod.Status.ContainerStatuses[1].ContainerID = "containerd://xyz"
	if _, _, ok := sandboxFromStatus(pod); ok {
		t.Fatal("adopted a sandbox another runtime wrote")
	}
}

func TestSummarize_NearestRank(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	l := summarize(s, 100)
	if l.Count != 100 || l.P50 != 50*time.Millisecond || l.P99 != 99*time.Millisecond || l.Max != 100*time.Millisecond {
		t.Fatalf("summary %+v", l)
	}
	if l := summarize(nil, 3); l.Count != 3 || l.Max != 0 {
		t.Fatalf("empty summary %+v", l)
	}
}

func TestLatencies_ThinsBeyondCap(t *testing.T) {
	var l latencies
	for i := range maxSamples + 10 {
		l.add(time.Duration(i))
	}
	sum := l.summary()
	if sum.Count != maxSamples+10 || len(l.samples) > maxSamples {
		t.Fatalf("count %d, kept %d samples (cap %d)", sum.Count, len(l.samples), maxSamples)
	}
	if sum.Max < time.Duration(maxSamples) {
		t.Fatalf("max %d lost the latest samples", sum.Max)
	}
}

func TestConfig_Validate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("the flag defaults: %v", err)
	}
	if err := (Config{}).Validate(); err == nil {
		t.Fatal("zero config accepted: no workers, no timeouts")
	}
	c := DefaultConfig()
	c.RetryBase, c.RetryMax = time.Second, time.Millisecond
	if err := c.Validate(); err == nil {
		t.Fatal("retry max below base accepted")
	}
	c = DefaultConfig()
	c.Workers = 0
	if err := c.Validate(); err == nil {
		t.Fatal("zero workers accepted")
	}
	if err := (Config{}).validateRegistration(); err == nil {
		t.Fatal("registration without cluster, VPC, subnet, security group accepted")
	}
}

func TestNodeObject_ShapedLikeCCE(t *testing.T) {
	s := &Simulator{cfg: Config{
		Name:             "x",
		InstanceCPUs:     16,
		InstanceMemoryGB: 64,
		InstanceType:     "BCC",
		Zone:             "cn-bj-a",
		MaxPodsPerNode:   110,
	}}
	n := s.nodeObject("x-00001", "i-x-00001")
	want := map[string]string{
		"cce.io/max-ip-per-eni": "30", "cce.io/max-eni-num": "8", "cce.io/warm-ip-target": "15", "cce.io/pre-attached-eni-num": "1",
	}
	for k, v := range want {
		if n.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, n.Annotations[k], v)
		}
	}
	if n.Spec.ProviderID != "cce://i-x-00001" || n.Labels[LabelInstanceType] != "BCC" || n.Labels[LabelInstanceTypeBeta] != "BCC" ||
		n.Labels[LabelSimulator] != "x" || n.Labels[LabelHostname] != "x-00001" || n.Labels[LabelZone] != "cn-bj-a" {
		t.Fatalf("node %+v", n.ObjectMeta)
	}
	// The node agent's extended resource: 8 ENIs × 30 IPs.
	st := s.nodeStatus()
	for _, l := range []corev1.ResourceList{st.Capacity, st.Allocatable} {
		if q := l[cce.ResourceIP]; q.Value() != 240 {
			t.Errorf("%s = %s, want 240 (max-eni-num × max-ip-per-eni)", cce.ResourceIP, q.String())
		}
	}
	if names := NodeNames("p", 7, 2); len(names) != 2 || names[0] != "p-00007" || names[1] != "p-00008" {
		t.Fatalf("NodeNames = %v", names)
	}
}
