package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
)

// logLines parses a JSON logger's output into one map per record.
func logLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}

// jsonLogger is a JSON logger at every level writing to a syncBuffer.
func jsonLogger() (*slog.Logger, *syncBuffer) {
	b := &syncBuffer{}
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// TestClaimFailureByClass: the middleware answers a failed claim by the
// class of its store-error reason (DESIGN-settled-r4 item 4, which reverses
// r3 item 2): a fail-open route bypasses only when the claim failed with
// timeout or connection AND the outage probe then failed with connection;
// a probe that found the database answering, or that failed otherwise
// (auth, too many connections, its own timeout), is 503 under the claim's
// reason. Saturation, a lock wait, a statement timeout, a remote node, a
// closed or full store and any reason of no known class are 503 on both
// policies without a probe; a configuration error is 503 on both with an
// ERROR log; contention is 409 and a refused value 400. Every log line
// carries the key, the scope and the reason; the Observation carries the
// store's reason.
func TestClaimFailureByClass(t *testing.T) {
	t.Parallel()
	probeDown := &StoreError{Op: "probe", Reason: ReasonConnection, Err: errors.New("connection refused")}
	for _, c := range []struct {
		reason     string
		probe      *StoreError // the probe's verdict; nil: the database answered
		open       int         // the fail-open route's status; 201 is a bypass
		closed     int         // the fail-closed route's status
		level      string      // of the claim failure's log line; "" for none
		observedAs Outcome
		probes     int64 // the probes run: only a fail-open route's, only on timeout or connection
	}{
		{ReasonTimeout, probeDown, 201, 503, "WARN", OutcomeBypassed, 1},
		{ReasonConnection, probeDown, 201, 503, "WARN", OutcomeBypassed, 1},
		{ReasonTimeout, nil, 503, 503, "WARN", OutcomeRejected, 1},
		{ReasonConnection, nil, 503, 503, "WARN", OutcomeRejected, 1},
		{ReasonConnection, &StoreError{Op: "probe", Reason: ReasonAuth, Err: errors.New("28P01")}, 503, 503, "WARN", OutcomeRejected, 1},
		{ReasonTimeout, &StoreError{Op: "probe", Reason: ReasonTooManyConnections, Err: errors.New("53300")}, 503, 503, "WARN", OutcomeRejected, 1},
		{ReasonTimeout, &StoreError{Op: "probe", Reason: ReasonTimeout, Err: context.DeadlineExceeded}, 503, 503, "WARN", OutcomeRejected, 1},
		{ReasonPoolExhausted, probeDown, 503, 503, "WARN", OutcomeRejected, 0},
		{ReasonStatementTimeout, probeDown, 503, 503, "WARN", OutcomeRejected, 0},
		{ReasonRemoteNode, probeDown, 503, 503, "WARN", OutcomeRejected, 0},
		{ReasonTooManyConnections, probeDown, 503, 503, "WARN", OutcomeRejected, 0},
		{ReasonLockTimeout, probeDown, 503, 503, "WARN", OutcomeRejected, 0},
		{ReasonClosed, probeDown, 503, 503, "WARN", OutcomeRejected, 0},
		{ReasonFull, probeDown, 503, 503, "WARN", OutcomeRejected, 0},
		{ReasonOther, probeDown, 503, 503, "WARN", OutcomeRejected, 0},
		{"a_third_party_reason", probeDown, 503, 503, "WARN", OutcomeRejected, 0},
		{ReasonAuth, probeDown, 503, 503, "ERROR", OutcomeRejected, 0},
		{ReasonSchema, probeDown, 503, 503, "ERROR", OutcomeRejected, 0},
		{ReasonPermission, probeDown, 503, 503, "ERROR", OutcomeRejected, 0},
		{ReasonConflict, probeDown, 409, 409, "", OutcomeConflict, 0},
		{ReasonData, probeDown, 400, 400, "WARN", OutcomeRejected, 0},
	} {
		name := c.reason
		if c.probe != nil {
			name += "/probe " + c.probe.Reason
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			logger, buf := jsonLogger()
			var observed []Observation
			h := newHarness(t, Config{Logger: logger, Observer: func(_ context.Context, o Observation) { observed = append(observed, o) }})
			e := error(&StoreError{Op: "claim", Reason: c.reason, Err: errors.New("it failed")})
			h.store.fail.Store(&e)
			if c.probe != nil {
				p := error(c.probe)
				h.store.probe.Store(&p)
			}
			open := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
			closed := h.route(RouteConfig{Name: "orders"}, orderHandler)
			for _, r := range []struct {
				name string
				h    http.Handler
				want int
			}{{"fail-open", open, c.open}, {"fail-closed", closed, c.closed}} {
				before := h.calls.Load()
				w := send(t, r.h, "POST", "/x", testKey, `{}`, "X-User", "u1")
				if w.Code != r.want {
					t.Errorf("%s route: %d %s, want %d", r.name, w.Code, w.Body, r.want)
				}
				if ran := h.calls.Load() - before; (ran == 1) != (r.want == 201) {
					t.Errorf("%s route: the handler ran %d times", r.name, ran)
				}
				if w.Code == 503 && w.Header().Get("Retry-After") != "1" {
					t.Errorf("%s route: 503 without Retry-After: 1", r.name)
				}
			}
			if n := h.store.probes.Load(); n != c.probes {
				t.Errorf("%d outage probes, want %d", n, c.probes)
			}
			bypasses := counter(t, h.mw.metrics.bypasses.WithLabelValues("billing", reasonStoreUnavailable))
			if want := map[bool]float64{true: 1}[c.open == 201]; bypasses != want {
				t.Errorf("bypasses = %v, want %v", bypasses, want)
			}
			if c.closed == 503 {
				if n := counter(t, h.mw.metrics.rejections.WithLabelValues("orders", reasonStoreUnavailable)); n != 1 {
					t.Errorf("store_unavailable rejections of the fail-closed route = %v, want 1", n)
				}
			}
			if len(observed) != 2 || observed[0].Outcome != c.observedAs || observed[0].StoreReason != c.reason ||
				observed[1].StoreReason != c.reason {
				t.Errorf("observations %+v, want the first %s, both with StoreReason %q", observed, c.observedAs, c.reason)
			}
			var lines int
			for _, l := range logLines(t, buf.String()) {
				if l["reason"] != c.reason {
					continue
				}
				lines++
				if l["level"] != c.level || l["key"] != testKey || l["scope"] != "u1" {
					t.Errorf("log line %v: want level %s with the key and the scope", l, c.level)
				}
			}
			if want := map[bool]int{true: 2}[c.level != ""]; lines != want {
				t.Errorf("%d log lines with reason %s, want %d:\n%s", lines, c.reason, want, buf)
			}
		})
	}
}

// TestBypassLogIdentifiers: the bypass WARN carries the key and the scope
// in the form Config allows: plain, as HMACs under IdentifierSecret, or
// left out under OmitIdentifiers, whose construction warns once that
// bypassed requests cannot then be listed.
func TestBypassLogIdentifiers(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef-secret")
	for _, c := range []struct {
		name      string
		cfg       Config
		key, user any // the values logged, nil for none
	}{
		{"plain", Config{}, testKey, "u1"},
		{"hmac", Config{IdentifierSecret: secret}, identifierHMAC(secret, testKey), identifierHMAC(secret, "u1")},
		{"omitted", Config{OmitIdentifiers: true}, nil, nil},
	} {
		logger, buf := jsonLogger()
		c.cfg.Logger = logger
		h := newHarness(t, c.cfg)
		construction := logLines(t, buf.String())
		warned := len(construction) == 1 && construction[0]["level"] == "WARN" &&
			strings.Contains(construction[0]["msg"].(string), "OmitIdentifiers")
		if warned != c.cfg.OmitIdentifiers || len(construction) > 1 {
			t.Errorf("%s: construction logged %v; want one WARN about OmitIdentifiers only when it is set", c.name, construction)
		}
		e := error(&StoreError{Op: "claim", Reason: ReasonConnection, Err: errors.New("connection refused")})
		h.store.fail.Store(&e)
		h.store.probe.Store(&e)
		rt := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
		if w := send(t, rt, "POST", "/x", testKey, `{}`, "X-User", "u1"); w.Code != 201 {
			t.Fatalf("%s: %d, want the bypass", c.name, w.Code)
		}
		lines := logLines(t, buf.String())
		l := lines[len(lines)-1]
		keyField, scopeField := "key", "scope"
		if c.name == "hmac" {
			keyField, scopeField = "key_hmac", "scope_hmac"
		}
		if l["key"] != nil && c.name != "plain" || l["scope"] != nil && c.name != "plain" ||
			l[keyField] != c.key || l[scopeField] != c.user || l["reason"] != ReasonConnection {
			t.Errorf("%s: bypass logged %v; want %s=%v, %s=%v and the reason", c.name, l, keyField, c.key, scopeField, c.user)
		}
	}
}

// TestStoreRecoveryLogged: after failing calls, the first call the store
// answers again logs one INFO line with the failures' count and duration;
// later answers log nothing more.
func TestStoreRecoveryLogged(t *testing.T) {
	t.Parallel()
	logger, buf := jsonLogger()
	h := newHarness(t, Config{Logger: logger})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	// Saturation: no claim of unknown outcome, so no background release
	// calls the store meanwhile.
	e := error(&StoreError{Op: "claim", Reason: ReasonPoolExhausted, Err: errors.New("every connection in use")})
	h.store.fail.Store(&e)
	for range 3 {
		if w := send(t, rt, "POST", "/x", testKey, `{}`); w.Code != 503 {
			t.Fatalf("during the outage: %d", w.Code)
		}
	}
	h.store.fail.Store(nil)
	for _, k := range []string{testKey, testKey2} {
		if w := send(t, rt, "POST", "/x", k, `{}`); w.Code != 201 {
			t.Fatalf("after the outage: %d", w.Code)
		}
	}
	var infos []map[string]any
	for _, l := range logLines(t, buf.String()) {
		if l["level"] == "INFO" {
			infos = append(infos, l)
		}
	}
	if len(infos) != 1 || infos[0]["failures"] != float64(3) || infos[0]["failed_for"] == nil ||
		!strings.Contains(infos[0]["msg"].(string), "recovered") {
		t.Fatalf("INFO lines %v, want one store recovery with failures=3 and failed_for", infos)
	}
}

// TestBypassLogRateLimited: bypasses are rate-limited in the log, never
// in the decision: five bypasses of one endpoint in a second all run their
// handler and are all counted, with one WARN and the others at DEBUG; the
// next second's first WARN says how many were held back.
func TestBypassLogRateLimited(t *testing.T) {
	t.Parallel()
	logger, buf := jsonLogger()
	h := newHarness(t, Config{Logger: logger})
	e := error(&StoreError{Op: "claim", Reason: ReasonConnection, Err: errors.New("connection refused")})
	h.store.fail.Store(&e)
	h.store.probe.Store(&e)
	rt := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
	for i := range 5 {
		if w := send(t, rt, "POST", "/x", fmt.Sprintf("%s%d", testKey[:len(testKey)-1], i), `{}`, "X-User", "u1"); w.Code != 201 {
			t.Fatalf("bypass %d: %d", i, w.Code)
		}
	}
	if n := counter(t, h.mw.metrics.bypasses.WithLabelValues("billing", reasonStoreUnavailable)); n != 5 {
		t.Errorf("bypasses = %v, want 5", n)
	}
	levels := map[any]int{}
	for _, l := range logLines(t, buf.String()) {
		if l["reason"] == ReasonConnection {
			levels[l["level"]]++
		}
	}
	if levels["WARN"] != 1 || levels["DEBUG"] != 4 {
		t.Errorf("bypass log lines by level %v, want 1 WARN and 4 DEBUG", levels)
	}
	if n, first := h.mw.metricsFor("billing").bypassLog.take(time.Now().Add(time.Second)); !first || n != 4 {
		t.Errorf("the next second's first line: first %v, held back %d; want true, 4", first, n)
	}
}

// TestProbeIsNotARecovery: a probe that finds the database answering
// while claims keep failing (a lock wait, a statement timeout) does not log
// the store as recovered; the next claim the store answers does, once.
func TestProbeIsNotARecovery(t *testing.T) {
	t.Parallel()
	logger, buf := jsonLogger()
	h := newHarness(t, Config{Logger: logger})
	e := error(&StoreError{Op: "claim", Reason: ReasonTimeout, Err: errors.New("no reply")})
	h.store.fail.Store(&e)
	rt := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
	for range 2 {
		if w := send(t, rt, "POST", "/x", testKey, `{}`); w.Code != 503 {
			t.Fatalf("a timed-out claim with the probe answering: %d, want 503", w.Code)
		}
	}
	if n := h.store.probes.Load(); n != 2 {
		t.Fatalf("%d probes, want 2", n)
	}
	recovered := func() (n int) {
		for _, l := range logLines(t, buf.String()) {
			if l["level"] == "INFO" && strings.Contains(l["msg"].(string), "recovered") {
				n++
			}
		}
		return n
	}
	if n := recovered(); n != 0 {
		t.Fatalf("%d recovery lines while claims fail, want 0:\n%s", n, buf)
	}
	h.store.fail.Store(nil)
	if w := send(t, rt, "POST", "/x", testKey2, `{}`); w.Code != 201 {
		t.Fatalf("after: %d", w.Code)
	}
	if n := recovered(); n != 1 {
		t.Fatalf("%d recovery lines once a claim is answered, want 1:\n%s", n, buf)
	}
}
