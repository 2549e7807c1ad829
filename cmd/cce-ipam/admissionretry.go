package main

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"k8s.io/client-go/rest"

	"github.com/cce-ipam/sharded/ipamcore/admissionretry"
)

// admissionRetries wires ipamcore/admissionretry into a client: a write the
// API server refused only because it could not configure a
// ValidatingAdmissionPolicy (the fencing policy's param Lease unread in
// time, on an overloaded server) is sent again within the call's deadline
// instead of failing the CNI call; each retry is counted and logged.
type admissionRetries struct {
	retried *prometheus.CounterVec
	log     *slog.Logger
}

func newAdmissionRetries(reg prometheus.Registerer, log *slog.Logger) *admissionRetries {
	return &admissionRetries{
		retried: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_kube_api_admission_retries_total",
			Help: "Writes sent again because the API server refused them only for a ValidatingAdmissionPolicy " +
				"it could not configure (failed to configure binding: the fencing policy's claim Lease unread in time), by client.",
		}, []string{"client"}),
		log: log,
	}
}

// wrap makes cfg's writes retry such refusals, counted under client.
func (a *admissionRetries) wrap(cfg *rest.Config, client string) {
	counter := a.retried.WithLabelValues(client)
	admissionretry.Wrap(cfg, func(r admissionretry.Retried) {
		counter.Inc()
		a.log.Debug("API server could not configure an admission policy; sending the write again",
			"client", client, "method", r.Method, "path", r.Path, "attempt", r.Attempt, "refusal", r.Message)
	})
}
