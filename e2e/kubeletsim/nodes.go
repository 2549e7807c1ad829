package kubeletsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// InstanceAdder creates BCC instances. The BCE OpenAPI cannot (instances come
// from CCE's node provisioning), so this is the simulator's admin surface:
// InProcessInstances for a bcesim.Server in the test process, AdminInstances
// for a bce-sim process.
type InstanceAdder interface {
	AddInstance(ctx context.Context, spec bcesim.InstanceSpec) (string, error)
}

// ENIAPI is the part of the BCE OpenAPI the node agent uses to pre-attach a
// node's first ENI; *cloud.Client implements it.
type ENIAPI interface {
	CreateENI(ctx context.Context, req cloud.CreateENIRequest) (string, error)
	AttachENI(ctx context.Context, eniID, instanceID string) error
	GetENI(ctx context.Context, eniID string) (*cloud.ENI, error)
}

// InProcessInstances adds instances to an in-process simulator.
func InProcessInstances(sim *bcesim.Server) InstanceAdder { return inProcess{sim} }

type inProcess struct{ sim *bcesim.Server }

func (p inProcess) AddInstance(_ context.Context, spec bcesim.InstanceSpec) (string, error) {
	return p.sim.AddInstance(spec)
}

// AdminInstances adds instances through a bce-sim process's admin API
// (POST /admin/instances) at baseURL, e.g. "http://127.0.0.1:8080". A nil
// client means http.DefaultClient.
func AdminInstances(baseURL string, client *http.Client) InstanceAdder {
	if client == nil {
		client = http.DefaultClient
	}
	return adminAPI{
		base:   strings.TrimRight(baseURL, "/"),
		client: client,
	}
}

type adminAPI struct {
	base   string
	client *http.Client
}

func (a adminAPI) AddInstance(ctx context.Context, spec bcesim.InstanceSpec) (string, error) {
	body, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+"/admin/instances", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("bce-sim admin: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("bce-sim admin: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("bce-sim admin: add instance: %s: %s", resp.Status, bytes.TrimSpace(data))
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(data, &out); err != nil || out.ID == "" {
		return "", fmt.Errorf("bce-sim admin: add instance: unexpected answer %q", data)
	}
	return out.ID, nil
}

// NodeInfo describes a registered node.
type NodeInfo struct {
	Name       string
	InstanceID string
	ENIID      string
}

// NodeNames returns count names "<prefix>-NNNNN" starting at index from.
func NodeNames(prefix string, from, count int) []string {
	out := make([]string, count)
	for k := range count {
		out[k] = fmt.Sprintf("%s-%05d", prefix, from+k)
	}
	return out
}

// InstanceID is the BCC instance a simulated node runs on: "i-<node>".
func InstanceID(node string) string { return "i-" + node }

// RegisterNodes brings up simulated BCC nodes, RegisterWorkers at a time, as
// CCE provisioning and the node agent would: a BCC instance, one ENI created
// and attached to it (waiting until it is in use), the IPPool ippool-<node>
// when Config.IPPool is set, and finally the Node object with the CCE
// labels, providerID cce://<instance>, capacity annotations and a Ready
// status. A node whose Node object already exists with this simulator's
// label is left alone, so registering again after a restart is safe. It
// returns the nodes it registered; on error, those it finished.
func (s *Simulator) RegisterNodes(ctx context.Context, names []string) ([]NodeInfo, error) {
	if err := s.cfg.validateRegistration(); err != nil {
		return nil, fmt.Errorf("kubeletsim: %w", err)
	}
	if s.deps.Instances == nil || s.deps.ENIs == nil {
		return nil, errors.New("kubeletsim: RegisterNodes needs Deps.Instances and Deps.ENIs")
	}
	var (
		mu   sync.Mutex
		out  []NodeInfo
		errs []error
		wg   sync.WaitGroup
	)
	work := make(chan string)
	for range min(s.cfg.RegisterWorkers, len(names)) {
		wg.Go(func() {
			for name := range work {
				info, done, err := s.registerNode(ctx, name)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("register node %s: %w", name, err))
				} else if done {
					out = append(out, info)
				}
				mu.Unlock()
			}
		})
	}
feed:
	for _, n := range names {
		select {
		case work <- n:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return out, errors.Join(errs...)
}

// registerNode reports done=false for a node that already existed.
func (s *Simulator) registerNode(ctx context.Context, name string) (NodeInfo, bool, error) {
	nodes := s.deps.Kube.CoreV1().Nodes()
	if n, err := nodes.Get(ctx, name, metav1.GetOptions{}); err == nil {
		if n.Labels[LabelSimulator] != s.cfg.Name {
			return NodeInfo{}, false, fmt.Errorf("node exists and is not simulated by %q", s.cfg.Name)
		}
		return NodeInfo{}, false, nil
	} else if !apierrors.IsNotFound(err) {
		return NodeInfo{}, false, err
	}
	info := NodeInfo{
		Name:       name,
		InstanceID: InstanceID(name),
	}
	err := retryCloud(ctx, func() error {
		_, err := s.deps.Instances.AddInstance(ctx, bcesim.InstanceSpec{
			ID: info.InstanceID, Name: name, SubnetID: s.cfg.SubnetID, CPUCount: s.cfg.InstanceCPUs,
			MemoryGB: s.cfg.InstanceMemoryGB, SecurityGroupIDs: s.cfg.SecurityGroupIDs,
		})
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil // a retry after an answer that got lost, or a restart
		}
		return err
	})
	if err != nil {
		return info, false, fmt.Errorf("add instance: %w", err)
	}
	err = retryCloud(ctx, func() error {
		var err error
		info.ENIID, err = s.deps.ENIs.CreateENI(ctx, cloud.CreateENIRequest{
			Name:     fmt.Sprintf("%s/%s/%s/000000", s.cfg.ClusterID, info.InstanceID, name),
			SubnetID: s.cfg.SubnetID, SecurityGroupIDs: s.cfg.SecurityGroupIDs,
			Description: "pre-attached by kubelet-sim (node agent)",
		})
		return err
	})
	if err != nil {
		return info, false, fmt.Errorf("create ENI: %w", err)
	}
	if err := retryCloud(ctx, func() error { return s.deps.ENIs.AttachENI(ctx, info.ENIID, info.InstanceID) }); err != nil {
		return info, false, fmt.Errorf("attach ENI %s: %w", info.ENIID, err)
	}
	if err := s.waitInUse(ctx, info.ENIID); err != nil {
		return info, false, err
	}
	if s.cfg.IPPool && s.deps.CCE != nil {
		_, err := s.deps.CCE.CceV1alpha1().IPPools(cce.IPPoolNamespace).Create(ctx, s.ipPool(name), metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return info, false, fmt.Errorf("create IPPool: %w", err)
		}
	}
	node, err := nodes.Create(ctx, s.nodeObject(name, info.InstanceID), metav1.CreateOptions{})
	if err != nil {
		return info, false, fmt.Errorf("create node: %w", err)
	}
	// kube-controller-manager (node lifecycle, taints) writes new nodes
	// too: re-read and retry on a conflict, as kubelet does.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if node == nil {
			if node, err = nodes.Get(ctx, name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		node.Status = s.nodeStatus()
		_, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		if err != nil {
			node = nil
		}
		return err
	})
	if err != nil {
		return info, false, fmt.Errorf("set node status: %w", err)
	}
	s.log.Debug("registered node", "node", name, "instance", info.InstanceID, "eni", info.ENIID)
	return info, true, nil
}

func (s *Simulator) waitInUse(ctx context.Context, eniID string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.AttachTimeout)
	defer cancel()
	for {
		e, err := s.deps.ENIs.GetENI(ctx, eniID)
		if err == nil && e.Status == cloud.ENIStatusInUse {
			return nil
		}
		if err != nil && !cloud.ClassOf(err).Retryable() {
			return fmt.Errorf("wait for ENI %s: %w", eniID, err)
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("ENI %s not in use after %s (last error: %w)", eniID, s.cfg.AttachTimeout, err)
			}
			return fmt.Errorf("ENI %s not in use after %s: %w", eniID, s.cfg.AttachTimeout, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// retryCloud retries a cloud call while it fails retryably (throttled, 5xx,
// no answer) and ctx lasts.
func retryCloud(ctx context.Context, fn func() error) error {
	delay := 100 * time.Millisecond
	for {
		err := fn()
		if err == nil || !cloud.ClassOf(err).Retryable() {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// maxENIs is the node agent's max-eni-num: min(vCPUs, 8).
func maxENIs(cpus int) int { return max(1, min(cpus, 8)) }

// nodeObject is a Node shaped like a CCE BCC node after the node agent ran.
func (s *Simulator) nodeObject(name, instanceID string) *corev1.Node {
	maxIPs := bcesim.MaxIPsPerENI(s.cfg.InstanceMemoryGB)
	labels := map[string]string{
		LabelSimulator:          s.cfg.Name,
		LabelInstanceType:       s.cfg.InstanceType,
		LabelInstanceTypeBeta:   s.cfg.InstanceType,
		LabelHostname:           name,
		"kubernetes.io/os":      "linux",
		"kubernetes.io/arch":    "amd64",
		"beta.kubernetes.io/os": "linux",
	}
	if s.cfg.Zone != "" {
		labels[LabelZone] = s.cfg.Zone
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: labels,
			Annotations: map[string]string{
				cce.AnnotationMaxIPPerENI:       strconv.Itoa(maxIPs),
				cce.AnnotationMaxENINum:         strconv.Itoa(maxENIs(s.cfg.InstanceCPUs)),
				cce.AnnotationWarmIPTarget:      strconv.Itoa(maxIPs / 2),
				cce.AnnotationPreAttachedENINum: "1",
			},
		},
		Spec: corev1.NodeSpec{ProviderID: "cce://" + instanceID},
	}
}

// ipCapacity is the extended resource cce.ResourceIP a node advertises, as
// the reference's node agent does: max-eni-num × max-ip-per-eni. The PSTS
// mutating webhook gives PSTS pods a request for one, so a scheduler places
// no more of them on a node than its ENIs can address.
func ipCapacity(cpus, memGB int) int64 {
	return int64(maxENIs(cpus)) * int64(bcesim.MaxIPsPerENI(memGB))
}

func (s *Simulator) nodeStatus() corev1.NodeStatus {
	now := metav1.Now()
	res := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(s.cfg.InstanceCPUs), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(int64(s.cfg.InstanceMemoryGB)<<30, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(int64(s.cfg.MaxPodsPerNode), resource.DecimalSI),
		cce.ResourceIP:        *resource.NewQuantity(ipCapacity(s.cfg.InstanceCPUs, s.cfg.InstanceMemoryGB), resource.DecimalSI),
	}
	return corev1.NodeStatus{
		Capacity:    res,
		Allocatable: res.DeepCopy(),
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "kubelet-sim is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2-sim", OperatingSystem: "linux", Architecture: "amd64",
			ContainerRuntimeVersion: "kubelet-sim://1"},
	}
}

// ipPool is the node's IPPool as the node agent writes it.
func (s *Simulator) ipPool(node string) *cce.IPPool {
	return &cce.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: cce.IPPoolName(node), Namespace: cce.IPPoolNamespace,
			Labels: map[string]string{LabelSimulator: s.cfg.Name}},
		Spec: cce.IPPoolSpec{
			NodeSelector:   cce.IPPoolNodeSelector(node),
			CreationSource: cce.IPPoolCreationSourceCNI,
			ENI: cce.ENISpec{VPCID: s.cfg.VPCID, AvailabilityZone: s.cfg.Zone,
				Subnets: []string{s.cfg.SubnetID}, SecurityGroups: s.cfg.SecurityGroupIDs},
		},
	}
}
