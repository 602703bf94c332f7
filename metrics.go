package idempotency

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the collectors of the metrics table in docs/operations.md. A nil
// Registerer gives collectors that count but are registered nowhere.
type metrics struct {
	miss           *prometheus.CounterVec
	hit            *prometheus.CounterVec
	replay         *prometheus.CounterVec
	conflicts      *prometheus.CounterVec
	rejections     *prometheus.CounterVec
	bypasses       *prometheus.CounterVec
	settleFailures *prometheus.CounterVec
	// plaintextReplays counts replays, through a sealing store, of rows recorded
	// before sealing was turned on.
	plaintextReplays *prometheus.CounterVec
	storeDuration    *prometheus.HistogramVec
	storeErrors      *prometheus.CounterVec
	tooLarge         *prometheus.CounterVec
	cleanupDeleted   prometheus.Counter
	reconcile        *prometheus.HistogramVec // reconcile hook calls by endpoint and outcome
	health           storeHealth              // the store's failures since it last answered, for the recovery log
}

// Label values. Endpoint labels are route names or ServeMux patterns, never
// raw paths, keys or users, so cardinality stays bounded.
const (
	unnamedEndpoint = "unnamed"

	reasonInFlight       = "in_flight"
	reasonPreviousFailed = "previous_failed"
	reasonOutcomeUnknown = "outcome_unknown"
	reasonBodyMismatch   = "body_mismatch"
	reasonKeyExpired     = "key_expired"
	reasonNotStored      = "not_stored"

	reasonMissingKey       = "missing_key"
	reasonInvalidKey       = "invalid_key"
	reasonInvalidScope     = "invalid_scope"
	reasonBodyTooLarge     = "body_too_large"
	reasonBodyUnreadable   = "body_unreadable"
	reasonStoreUnavailable = "store_unavailable"
	reasonLeaseLost        = "lease_lost" // a Heartbeat handler's lease was lost: 503
	reasonDisabled         = "disabled"
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &metrics{
		miss:           counter("idempotency_miss_total", "Requests that claimed their key (new, expired takeover).", "endpoint"),
		hit:            counter("idempotency_hit_total", "Requests that found a live row for their key.", "endpoint"),
		replay:         counter("idempotency_replay_total", "Stored responses served.", "endpoint"),
		conflicts:      counter("idempotency_conflicts_total", "409 and 422 answers to requests that found a live row.", "endpoint", "reason"),
		rejections:     counter("idempotency_rejections_total", "4xx and 503 answers before any claim.", "endpoint", "reason"),
		bypasses:       counter("idempotency_bypasses_total", "Requests whose handler ran without deduplication.", "endpoint", "reason"),
		settleFailures: counter("idempotency_record_failures_total", "Responses that could not be recorded.", "endpoint"),
		plaintextReplays: counter("idempotency_plaintext_replays_total",
			"Replays through a sealing store of responses recorded before sealing (plaintext rows).", "endpoint"),
		storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idempotency_store_duration_seconds",
			Help:    "Duration of store calls by operation.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"operation"}),
		storeErrors: counter("idempotency_store_errors_total", "Store errors by operation and kind.", "operation", "reason"),
		tooLarge: counter("idempotency_response_too_large_total",
			"Transactional responses over the buffer cap (answered 500, writes rolled back, key failed).", "endpoint"),
		cleanupDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idempotency_cleanup_deleted_total",
			Help: "Rows removed by cleanup.",
		}),
		reconcile: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idempotency_reconcile_duration_seconds",
			Help:    "Reconciles of stale keys by outcome (done, not_done, unknown): the reconcile claim and the hook.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"endpoint", "outcome"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.miss, m.hit, m.replay, m.conflicts, m.rejections,
		m.bypasses, m.settleFailures, m.plaintextReplays, m.storeDuration, m.storeErrors, m.tooLarge, m.cleanupDeleted, m.reconcile} {
		if err := reg.Register(c); err != nil {
			return nil, errors.Join(errors.New("idempotency: Config.Registerer: cannot register metrics"), err)
		}
	}
	return m, nil
}

// routeMetrics are one route's counters with the endpoint label already
// bound, so the request path does no label lookups. A route without a
// configured name learns its label per request (the ServeMux pattern), so
// its counters are looked up then.
type routeMetrics struct {
	miss, hit, replay, settleFailures prometheus.Counter
	bypassLog                         logLimiter // the endpoint's bypass WARNs (serve.go)
}

func (m *metrics) forEndpoint(label string) *routeMetrics {
	return &routeMetrics{
		miss:           m.miss.WithLabelValues(label),
		hit:            m.hit.WithLabelValues(label),
		replay:         m.replay.WithLabelValues(label),
		settleFailures: m.settleFailures.WithLabelValues(label),
	}
}

// storeOps holds a pre-labelled duration observer per store operation: the
// operation labels of the metrics table.
type storeOps map[string]prometheus.Observer

func newStoreOps(met *metrics) storeOps {
	ops := storeOps{}
	for _, op := range []string{"claim", "takeover", "complete", "fail", "release", opReleaseOwner,
		"begin", "commit", "end_lease", opReconcile, opStale, "cleanup", "erase", opProbe, opRenew} {
		ops[op] = met.storeDuration.WithLabelValues(op)
	}
	return ops
}
