//go:build integration

package charttest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/cce-ipam/sharded/membership"
)

const ciValues = chartDir + "/ci/five-replicas-values.yaml"

// helm lint and helm template pass with the default values and with the ci
// values, and the rendered objects have the shape the README promises.
func TestChart_LintAndTemplate(t *testing.T) {
	for _, tc := range []struct {
		name         string
		args         []string
		replicas     int32
		extras       bool // ServiceMonitor and dashboard ConfigMap
		existingBCE  string
		existingGosp string
	}{
		{name: "defaults", replicas: 3},
		{name: "five-replicas", args: []string{"-f", ciValues}, replicas: 5, extras: true,
			existingBCE: "cce-ipam-bce", existingGosp: "cce-ipam-gossip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if out, err := helm(t, append([]string{"lint", "--strict", chartDir}, tc.args...)...); err != nil {
				t.Fatal(err)
			} else if !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint:\n%s", out)
			}
			objs := render(t, "rel", "kube-system", tc.args...)
			d := deployment(t, objs)
			if got := *d.Spec.Replicas; got != tc.replicas {
				t.Errorf("replicas = %d, want %d", got, tc.replicas)
			}
			checkPodSpec(t, d)
			checkServices(t, objs)
			if got := len(find(objs, "ServiceMonitor")); got != map[bool]int{true: 1}[tc.extras] {
				t.Errorf("%d ServiceMonitors rendered, want one only with the ci values", got)
			}
			for _, rule := range []string{"rel-cce-ipam-reference-metrics", "rel-cce-ipam-alerts"} {
				if got := len(find(objs, "PrometheusRule", rule)); got != map[bool]int{true: 1}[tc.extras] {
					t.Errorf("%d PrometheusRules %s rendered, want one only with the ci values", got, rule)
				}
			}
			dashboards := find(objs, "ConfigMap")
			if got := len(dashboards); got != map[bool]int{true: 1}[tc.extras] {
				t.Fatalf("%d ConfigMaps rendered, want the dashboard only with the ci values", got)
			}
			if tc.extras {
				checkDashboardConfigMap(t, dashboards[0])
			}
			secrets := map[string]bool{}
			for _, s := range find(objs, "Secret") {
				secrets[s.GetName()] = true
			}
			vols := map[string]string{}
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Secret != nil {
					vols[v.Name] = v.Secret.SecretName
				}
			}
			for vol, existing := range map[string]string{"bce-credentials": tc.existingBCE, "gossip-key": tc.existingGosp} {
				name, mounted := vols[vol]
				switch {
				case vol == "gossip-key" && existing == "":
					// The replicas keep the keys in a Secret they create.
					if mounted || !slices.Contains(container(t, d).Args, "--memberlist-key-secret=rel-cce-ipam-keys") {
						t.Errorf("without an existing gossip key Secret: volume %q mounted, args %q; want no volume and --memberlist-key-secret",
							name, container(t, d).Args)
					}
				case existing != "" && (name != existing || secrets[name]):
					t.Errorf("volume %s mounts Secret %q (rendered: %v), want the existing %q and no rendered Secret", vol, name, secrets[name], existing)
				case existing == "" && !secrets[name]:
					t.Errorf("volume %s mounts Secret %q, which the chart does not render", vol, name)
				}
			}
		})
	}
}

// grpc.bindPodIP binds the CNI endpoint to the pod IP (status.podIP; with
// hostNetwork the node's IP) instead of every interface; the default is
// unchanged. The fleet test runs a replica with it.
func TestChart_GRPCBindPodIP(t *testing.T) {
	for bind, want := range map[bool]string{false: "--grpc-listen=:9997", true: "--grpc-listen=$(POD_IP):9997"} {
		c := container(t, deployment(t, render(t, "rel", "kube-system", "--set", fmt.Sprintf("grpc.bindPodIP=%v", bind))))
		if !slices.Contains(c.Args, want) {
			t.Errorf("grpc.bindPodIP=%v: args %q lack %q", bind, c.Args, want)
		}
		podIP := false
		for _, e := range c.Env {
			podIP = podIP || (e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
				e.ValueFrom.FieldRef.FieldPath == "status.podIP")
		}
		if !podIP {
			t.Errorf("grpc.bindPodIP=%v: no POD_IP from status.podIP", bind)
		}
	}
}

// GitOps renders with `helm template`, where lookup finds nothing: the
// render holds no random value, so two renders are the same bytes (no key is
// regenerated, no Secret changes under Argo CD's feet), with the chart's own
// BCE Secret and with an existing key Secret alike.
func TestChart_TemplateIsStable(t *testing.T) {
	for name, args := range map[string][]string{
		"defaults":    {"--set", "cluster.id=cce-x,cluster.vpcID=vpc-x,bce.region=bj"},
		"credentials": {"--set", "cluster.id=cce-x,cluster.vpcID=vpc-x,bce.region=bj,bce.credentials.accessKeyID=ak,bce.credentials.secretAccessKey=sk"},
		"ci":          {"-f", ciValues},
	} {
		first, err := helm(t, append([]string{"template", "rel", chartDir, "--namespace", "kube-system"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		second, err := helm(t, append([]string{"template", "rel", chartDir, "--namespace", "kube-system"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		if first != second {
			t.Errorf("%s: two renders differ", name)
		}
	}
}

func checkPodSpec(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template.Spec
	c := container(t, d)
	if pod.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName = %q", pod.PriorityClassName)
	}
	if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds < 30 {
		t.Errorf("terminationGracePeriodSeconds = %v, want ≥ 30 for a hand-over", pod.TerminationGracePeriodSeconds)
	}
	if ru := d.Spec.Strategy.RollingUpdate; d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxSurge == nil {
		t.Errorf("strategy = %+v, want a rolling update with maxSurge", d.Spec.Strategy)
	}
	if pod.Affinity == nil || pod.Affinity.PodAntiAffinity == nil || len(pod.TopologySpreadConstraints) == 0 {
		t.Errorf("no pod anti-affinity or topology spread: %+v %+v", pod.Affinity, pod.TopologySpreadConstraints)
	}
	for _, tsc := range pod.TopologySpreadConstraints {
		if tsc.LabelSelector == nil || tsc.LabelSelector.MatchLabels["app.kubernetes.io/name"] != "cce-ipam" {
			t.Errorf("topology spread constraint %s has no selector of the pods", tsc.TopologyKey)
		}
	}
	psc, sc := pod.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod security context %+v: want non-root", psc)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container security context %+v: want read-only root, no escalation, drop ALL", sc)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.StrVal != "metrics" {
		t.Errorf("liveness probe %+v, want GET /healthz on the metrics port", p)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.StrVal != "metrics" {
		t.Errorf("readiness probe %+v, want GET /readyz on the metrics port", p)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v, want CPU and memory requests and a memory limit", c.Resources)
	}
	for _, a := range c.Args {
		if strings.Contains(a, "secret-access-key") || strings.Contains(a, "access-key-id") {
			t.Errorf("credential flag in args: %q (credentials come from files)", a)
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			t.Errorf("env %s comes from a Secret; secrets are mounted as files", e.Name)
		}
	}
}

func checkServices(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	var cni, peers *corev1.Service
	for _, o := range find(objs, "Service") {
		s := typed[corev1.Service](t, o)
		switch s.Labels["app.kubernetes.io/component"] {
		case "cni":
			cni = s
		case "peers":
			peers = s
		}
	}
	if cni == nil || peers == nil {
		t.Fatalf("want a CNI and a peers Service, got cni=%v peers=%v", cni != nil, peers != nil)
	}
	if len(cni.Spec.Ports) != 1 || cni.Spec.Ports[0].Port != 80 || cni.Spec.Ports[0].TargetPort.StrVal != "grpc" {
		t.Errorf("CNI Service ports %+v, want 80 → grpc", cni.Spec.Ports)
	}
	if peers.Spec.ClusterIP != corev1.ClusterIPNone || !peers.Spec.PublishNotReadyAddresses {
		t.Errorf("peers Service: clusterIP %q, publishNotReadyAddresses %v; want headless, not-ready addresses published",
			peers.Spec.ClusterIP, peers.Spec.PublishNotReadyAddresses)
	}
	protos := map[string]corev1.Protocol{}
	for _, p := range peers.Spec.Ports {
		protos[p.Name] = p.Protocol
	}
	if protos["memberlist"] != corev1.ProtocolTCP || protos["memberlist-udp"] != corev1.ProtocolUDP || protos["metrics"] != corev1.ProtocolTCP {
		t.Errorf("peers Service ports %v, want memberlist TCP+UDP and metrics", protos)
	}
}

func checkDashboardConfigMap(t *testing.T, cm *unstructured.Unstructured) {
	t.Helper()
	if cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v lack grafana_dashboard: \"1\"", cm.GetLabels())
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	want, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "cce-ipam.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(data["cce-ipam.json"]) != strings.TrimSpace(string(want)) {
		t.Error("the dashboard ConfigMap does not carry dashboards/cce-ipam.json verbatim")
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(data["cce-ipam.json"]), &v); err != nil {
		t.Errorf("dashboard in the ConfigMap is not JSON: %v", err)
	}
}

// Credentials given as values end up in the Secret only: not in args, env,
// annotations or ConfigMaps.
func TestChart_SecretsOnlyInSecrets(t *testing.T) {
	const ak, sk = "AKnotInArgs123", "SKnotAnywhereElse456"
	objs := render(t, "rel", "kube-system", "-f", ciValues,
		"--set", "bce.credentials.existingSecret=", "--set", "bce.credentials.accessKeyID="+ak,
		"--set", "bce.credentials.secretAccessKey="+sk)
	found := 0
	for _, o := range objs {
		data, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		s := string(data)
		leak := strings.Contains(s, ak) || strings.Contains(s, sk)
		for _, enc := range []string{base64.StdEncoding.EncodeToString([]byte(ak)), base64.StdEncoding.EncodeToString([]byte(sk))} {
			if strings.Contains(s, enc) {
				if o.GetKind() != "Secret" {
					t.Errorf("%s %s contains a base64 credential", o.GetKind(), o.GetName())
				}
				found++
			}
		}
		if leak {
			t.Errorf("%s %s contains a credential in plain text", o.GetKind(), o.GetName())
		}
	}
	if found != 2 {
		t.Errorf("found the credentials %d times in Secrets, want 2 (access-key-id, secret-access-key)", found)
	}
}

// With bce.credentials.mode=gateway the replicas get the CCE gateway's flags
// instead of the AK/SK directory, no AK/SK Secret exists or is mounted, the
// token Secret is mounted where the release shares its namespace, and a Role
// there grants get on it by name.
func TestChart_GatewayCredentials(t *testing.T) {
	for _, ns := range []string{"kube-system", "cce-ipam"} {
		objs := render(t, "rel", ns, "-f", ciValues, "--set", "bce.credentials.mode=gateway",
			"--set", "bce.gateway.endpoint=gw.example:8080")
		c := container(t, deployment(t, objs))
		args := strings.Join(c.Args, " ")
		for _, want := range []string{"--cce-gateway-token-secret=kube-system/cce-plugin-token",
			"--cce-gateway-token-dir=/var/run/secrets/cce/cce-plugin-token", "--cce-gateway-endpoint=gw.example:8080"} {
			if !strings.Contains(args, want) {
				t.Errorf("%s: args lack %s: %s", ns, want, args)
			}
		}
		if strings.Contains(args, "--bce-credentials-dir") {
			t.Errorf("%s: gateway mode still passes --bce-credentials-dir", ns)
		}
		for _, sec := range find(objs, "Secret") {
			if _, ok, _ := unstructured.NestedString(sec.Object, "data", "access-key-id"); ok {
				t.Errorf("%s: AK/SK Secret %s rendered in gateway mode", ns, sec.GetName())
			}
		}
		mounted := false
		for _, m := range c.VolumeMounts {
			if m.Name == "bce-credentials" {
				t.Errorf("%s: AK/SK volume mounted in gateway mode", ns)
			}
			mounted = mounted || (m.Name == "cce-plugin-token" && m.MountPath == "/var/run/secrets/cce/cce-plugin-token")
		}
		if mounted != (ns == "kube-system") {
			t.Errorf("%s: token Secret mounted = %v, want it only in its own namespace", ns, mounted)
		}
		roles := find(objs, "Role", "rel-cce-ipam-cce-gateway-token")
		if len(roles) != 1 || roles[0].GetNamespace() != "kube-system" {
			t.Fatalf("%s: token Role %v", ns, roles)
		}
		rules, _, _ := unstructured.NestedSlice(roles[0].Object, "rules")
		if got := fmt.Sprint(rules); !strings.Contains(got, "cce-plugin-token") || !strings.Contains(got, "[get]") ||
			strings.Contains(got, "list") {
			t.Errorf("%s: token Role rules %s, want get on cce-plugin-token only", ns, got)
		}
		if len(find(objs, "RoleBinding", "rel-cce-ipam-cce-gateway-token")) != 1 {
			t.Errorf("%s: no RoleBinding for the token Role", ns)
		}
	}
	// The default stays AK/SK.
	def := render(t, "rel", "kube-system", "-f", ciValues)
	if args := strings.Join(container(t, deployment(t, def)).Args, " "); strings.Contains(args, "cce-gateway") ||
		!strings.Contains(args, "--bce-credentials-dir") {
		t.Errorf("default args: %s", args)
	}
}

// values.schema.json refuses bad values (helm template fails naming the
// value), and accepts good overrides.
func TestChart_SchemaRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		set, wantErr string
	}{
		{"replicaCount=0", "/replicaCount"},
		{"replicas=3", "additional properties 'replicas' not allowed"},
		{"sharding.leaseDuration=8", "/sharding/leaseDuration"},
		{"sharding.leaseDuration=eight", "/sharding/leaseDuration"},
		{"logLevel=verbose", "/logLevel"},
		{"service.port=70000", "/service/port"},
		{"ipam.batchAddIPNum=11", "/ipam/batchAddIPNum"},
		{"ipam.eniSubnetSelection=Random", "/ipam/eniSubnetSelection"},
		{"podAntiAffinity=sometimes", "/podAntiAffinity"},
		{"extraArgs[0]=no-dashes", "/extraArgs/0"},
		{"image.pullPolicy=Sometimes", "/image/pullPolicy"},
		{"bce.credentials.accesKeyID=typo", "additional properties 'accesKeyID' not allowed"},
		{"webhook.pods.failurePolicy=Sometimes", "/webhook/pods/failurePolicy"},
		{"webhook.psts.timeoutSeconds=31", "/webhook/psts/timeoutSeconds"},
		{"bce.credentials.mode=token", "/bce/credentials/mode"},
		{"bce.gateway.endpoint=http://gw", "/bce/gateway/endpoint"},
		{"bce.gateway.tokenSecret=no-namespace", "/bce/gateway/tokenSecret"},
		{"alerts.cniFailureRatio.threshold=2", "/alerts/cniFailureRatio"},
		{"alerts.leaseInvalid.for=soon", "/alerts/leaseInvalid/for"},
		{"alerts.leaseInvalid.limit=1", "additional properties 'limit' not allowed"},
	} {
		_, err := helm(t, "template", "rel", chartDir, "--set", tc.set)
		if err == nil {
			t.Errorf("--set %s: helm template succeeded, want a schema error", tc.set)
			continue
		}
		if !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("--set %s: error does not mention %q:\n%v", tc.set, tc.wantErr, err)
		}
	}
	if _, err := helm(t, "template", "rel", chartDir, "--set", "replicaCount=7,sharding.leaseDuration=1m30s,extraArgs[0]=--gc-period=1m"); err != nil {
		t.Errorf("good values refused: %v", err)
	}
}

// The API server accepts every rendered object (server-side apply, dry run:
// admission, validation and the CRD schemas all run), with the default and
// the ci values, CRDs included. The ServiceMonitor needs its CRD, which the
// Prometheus operator would install; a minimal one is installed here.
func TestChart_ServerDryRunAccepted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installServiceMonitorCRD(t, ctx)
	installPrometheusRuleCRD(t, ctx)
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cp.Config)))
	ns := cp.Namespace(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"defaults", nil},
		{"five-replicas", []string{"-f", ciValues}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, "dry", ns, append([]string{"--include-crds"}, tc.args...)...)
			objs = append(objs, renderTestHook(t, "dry", ns, tc.args...)...)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
				mapping, err := mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
				if err != nil {
					t.Errorf("%s %s: no such resource on the server: %v", o.GetKind(), o.GetName(), err)
					continue
				}
				var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
				if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
					if o.GetNamespace() != ns {
						t.Errorf("%s %s renders into namespace %q, want the release namespace %s", o.GetKind(), o.GetName(), o.GetNamespace(), ns)
					}
					ri = dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
				}
				data, err := json.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
					DryRun: []string{metav1.DryRunAll}, FieldManager: "charttest", Force: new(true),
				}); err != nil {
					t.Errorf("server refused %s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
			for _, k := range []string{"CustomResourceDefinition", "Deployment", "Service", "ServiceAccount", "ClusterRole",
				"ClusterRoleBinding", "Role", "RoleBinding", "PodDisruptionBudget"} {
				if kinds[k] == 0 {
					t.Errorf("no %s rendered (kinds: %v)", k, kinds)
				}
			}
			if kinds["CustomResourceDefinition"] != 6 {
				t.Errorf("%d CRDs rendered, want 6 (workloadendpoints, ippools, subnets, podsubnettopologyspreads, "+
					"podsubnettopologyspreadtables, ipclaims)", kinds["CustomResourceDefinition"])
			}
		})
	}
}

// installServiceMonitorCRD installs a minimal monitoring.coreos.com/v1
// ServiceMonitor CRD (the operator's own is large; its schema is not under
// test) and waits until discovery serves it.
func installServiceMonitorCRD(t *testing.T, ctx context.Context) {
	t.Helper()
	// The operator's RelabelConfig (fields and action enum of monitoring.coreos.com/v1).
	var actions []apiextensionsv1.JSON
	for _, a := range []string{"replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase",
		"uppercase", "keepequal", "dropequal"} {
		for _, v := range []string{a, strings.ToUpper(a[:1]) + a[1:]} {
			actions = append(actions, apiextensionsv1.JSON{Raw: []byte(`"` + v + `"`)})
		}
	}
	relabelConfigs := apiextensionsv1.JSONSchemaProps{Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{
		Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"sourceLabels": {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string"}}},
			"separator":    {Type: "string"}, "targetLabel": {Type: "string"}, "regex": {Type: "string"},
			"modulus": {Type: "integer", Format: "int64"}, "replacement": {Type: "string"},
			"action": {Type: "string", Enum: actions},
		},
	}}}
	cs := apiextensionsclient.NewForConfigOrDie(cp.Config)
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "servicemonitors.monitoring.coreos.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "monitoring.coreos.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "servicemonitors", Singular: "servicemonitor", Kind: "ServiceMonitor", ListKind: "ServiceMonitorList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Required: []string{"selector", "endpoints"}, Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"selector": {Type: "object", XPreserveUnknownFields: new(true)},
							"namespaceSelector": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
								"matchNames": {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string"}}},
							}},
							"endpoints": {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{
								Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
									"port": {Type: "string"}, "path": {Type: "string"},
									"interval":          {Type: "string", Pattern: `^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`},
									"scrapeTimeout":     {Type: "string", Pattern: `^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`},
									"relabelings":       relabelConfigs,
									"metricRelabelings": relabelConfigs,
								},
							}}},
						}},
					},
				}},
			}},
		},
	}
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	disc := discovery.NewDiscoveryClientForConfigOrDie(cp.Config)
	eventually(t, ctx, 200*time.Millisecond, "ServiceMonitor CRD served", func() error {
		_, err := disc.ServerResourcesForGroupVersion("monitoring.coreos.com/v1")
		return err
	})
}

// helm install into the control plane works and helm upgrade rolls it; the
// chart renders no key Secret (the replicas create it: the fleet test).
func TestChart_HelmInstallAndUpgrade(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := cp.Namespace(t)
	release := "inst"
	common := []string{"--kubeconfig", cp.Kubeconfig, "--namespace", ns, "--set", "cluster.id=cce-x,cluster.vpcID=vpc-x,bce.region=bj"}
	notes, err := helm(t, append([]string{"install", release, chartDir}, common...)...)
	if err != nil {
		t.Fatal(err)
	}
	// NOTES.txt: the replicas and, since no credentials were given, a warning naming them.
	for _, want := range []string{"cce-ipam runs 3 active replicas in " + ns, "WARNING", "bce.credentials.existingSecret"} {
		if !strings.Contains(notes, want) {
			t.Errorf("helm install output lacks %q:\n%s", want, notes)
		}
	}
	if strings.Contains(notes, "cluster.id") {
		t.Errorf("NOTES warn about cluster.id although it is set:\n%s", notes)
	}
	t.Cleanup(func() {
		if _, err := helm(t, "uninstall", release, "--kubeconfig", cp.Kubeconfig, "--namespace", ns); err != nil {
			t.Errorf("helm uninstall: %v", err)
		}
	})
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	if secrets, err := kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	} else {
		for _, s := range secrets.Items {
			if s.Data[membership.KeySecretGossip] != nil || s.Data[membership.KeySecretForward] != nil {
				t.Errorf("helm install created the key Secret %s; the replicas create it", s.Name)
			}
		}
	}
	if _, err := helm(t, append([]string{"upgrade", release, chartDir, "--set", "replicaCount=4"}, common...)...); err != nil {
		t.Fatal(err)
	}
	d, err := kube.AppsV1().Deployments(ns).Get(ctx, release+"-cce-ipam", metav1.GetOptions{})
	if err != nil || *d.Spec.Replicas != 4 {
		t.Fatalf("after upgrade: %v, %v; want 4 replicas", d, err)
	}
	if d.Spec.Template.Spec.Containers[0].Lifecycle == nil || d.Spec.Template.Spec.Containers[0].Lifecycle.PreStop == nil ||
		d.Spec.Template.Spec.Containers[0].Lifecycle.PreStop.Sleep == nil {
		t.Errorf("installed against Kubernetes ≥ 1.30, the pods have no preStop sleep")
	}
}

// rbacRow is one (scope, group, resource, verb) permission.
type rbacRow struct{ scope, group, resource, verb string }

// The rendered ClusterRole and Role grant exactly the permissions listed in
// the chart README (which names the code using each one); the fleet test
// proves they suffice.
func TestChart_RBACMatchesDocumentedList(t *testing.T) {
	objs := render(t, "rel", "kube-system")
	granted := map[rbacRow]bool{}
	// The only objects a rule may name: the webhooks' configurations and
	// certificate Secret, the key Secret (the README says which rules are
	// limited to them).
	named := map[string]bool{"rel-cce-ipam": true, "rel-cce-ipam-webhook-certs": true, "rel-cce-ipam-keys": true}
	add := func(scope string, rules []rbacv1.PolicyRule) {
		for _, r := range rules {
			if len(r.NonResourceURLs) > 0 {
				t.Errorf("unexpected rule %+v", r)
			}
			for _, n := range r.ResourceNames {
				if !named[n] {
					t.Errorf("rule %+v names %q, not one of the webhooks' objects", r, n)
				}
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						if g == "*" || res == "*" || v == "*" {
							t.Errorf("wildcard in rule %+v", r)
						}
						granted[rbacRow{scope, choose(g == "", "core", g), res, v}] = true
					}
				}
			}
		}
	}
	add("cluster", typed[rbacv1.ClusterRole](t, one(t, objs, "ClusterRole")).Rules)
	add("namespace", typed[rbacv1.Role](t, one(t, objs, "Role")).Rules)

	documented := readDocumentedRBAC(t)
	var missing, undocumented []string
	for r := range documented {
		if !granted[r] {
			missing = append(missing, fmt.Sprint(r))
		}
	}
	for r := range granted {
		if !documented[r] {
			undocumented = append(undocumented, fmt.Sprint(r))
		}
	}
	sort.Strings(missing)
	sort.Strings(undocumented)
	if len(missing) > 0 || len(undocumented) > 0 {
		t.Fatalf("RBAC and the README disagree:\n  documented, not granted: %v\n  granted, not documented: %v", missing, undocumented)
	}
	if len(granted) < 20 {
		t.Fatalf("only %d permissions parsed; is the README table intact?", len(granted))
	}
}

func choose(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

// readDocumentedRBAC parses the table between the rbac markers of the README.
func readDocumentedRBAC(t *testing.T) map[rbacRow]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok1 := strings.Cut(string(data), "<!-- rbac:begin -->")
	table, _, ok2 := strings.Cut(rest, "<!-- rbac:end -->")
	if !ok1 || !ok2 {
		t.Fatal("README lacks the rbac markers")
	}
	out := map[rbacRow]bool{}
	for _, line := range strings.Split(strings.TrimSpace(table), "\n")[2:] {
		cells := strings.Split(strings.Trim(line, "| "), "|")
		if len(cells) < 4 {
			t.Fatalf("bad RBAC table row %q", line)
		}
		scope, group, resource := strings.TrimSpace(cells[0]), strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2])
		for _, v := range strings.Split(cells[3], ",") {
			out[rbacRow{scope, group, resource, strings.TrimSpace(v)}] = true
		}
	}
	return out
}
