// Package charttest tests the Helm chart charts/cce-ipam with real parts: the
// pinned helm binary, a real kube-apiserver (e2e/cluster), bce-sim and
// cce-ipam processes, the kubelet simulator and a real Prometheus. Every test
// but TestDashboard_Lint needs bin/ (make tools, make binaries) and carries the
// integration tag.
//
//   - TestChart_LintAndTemplate: helm lint and helm template, with the
//     default values and with ci/five-replicas-values.yaml; what the
//     rendered objects must look like (probes, security, Services, no
//     secrets outside Secrets).
//   - TestChart_SchemaRejectsBadValues: values.schema.json refuses bad values.
//   - TestChart_ServerDryRunAccepted: the API server accepts every rendered
//     object (server-side apply, dry run), CRDs and ServiceMonitor included.
//   - TestChart_GRPCBindPodIP: grpc.bindPodIP binds the CNI endpoint to
//     $(POD_IP) only.
//   - TestChart_TemplateIsStable: two helm template renders are the same bytes
//     (no generated key: the replicas create the key Secret).
//   - TestChart_HelmInstallAndUpgrade: helm install and upgrade into the
//     control plane; no key Secret is installed.
//   - TestChart_LeaseNamesRestricted: as the chart's ServiceAccount, the
//     lease-name policy refuses writes of Leases outside cce-ipam-*.
//   - TestChart_RBACMatchesDocumentedList: the rendered rules equal the list
//     in the chart README.
//   - TestChart_FleetUnderPrometheus: three cce-ipam processes run with
//     exactly the args and env of the rendered Deployment, as the chart's
//     ServiceAccount; the kubelet simulator allocates through them while a
//     real Prometheus scrapes them; every dashboard query must return data,
//     promtool must find nothing to complain about in /metrics, no
//     replica may log "forbidden", and every verb the RBAC grants must show
//     up in the API server's audit log of the run (or be named, with its
//     code, in notExercised).
//   - TestChart_HelmTestHook: helm install into the control plane, the
//     peers Service resolving to three replicas in network namespaces
//     (Pods, an EndpointSlice), then helm test with the test playing kubelet
//     for the hook pod (bin/ipamctl as the hook's ServiceAccount, in a
//     restricted-PSS namespace): passes; with a replica killed, fails naming
//     the member count. The hook's Role is all it used (audit log).
//     render skips the hook's objects (helm install does not create them);
//     renderTestHook renders them.
//   - TestChart_KubeVersion, _Subchart, _UpdateStrategy, _ServiceMonitorOptions,
//     _ImageDigest, _ExtraVolumes, _PodVersionLabel, TestCRDs_Categories: the
//     chart conventions (kubeVersion, global values, the Deployment strategy
//     shape, CRD categories on the API server).
//   - TestDashboard_Lint (no build tag): the rules of Grafana's dashboard
//     linter over dashboards/cce-ipam.json, each with a dashboard broken for it.
//
// Run them with
//
//	go test -race -tags integration ./charts/...
package charttest
