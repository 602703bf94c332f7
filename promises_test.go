package idempotency

// Tests of promises the README makes that no other test held: each was
// found by breaking the code on purpose and watching the suite pass.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// hookStore is a MemoryStore whose outcome calls first go through hooks: a
// hook that returns an error stands for a failing store (the call does not
// reach the memory store); one that returns nil lets it through.
type hookStore struct {
	*MemoryStore
	claim                   func(ctx context.Context, req ClaimRequest) error
	complete, fail, release func(ctx context.Context, try int) error
	completes, fails, rels  atomic.Int64
}

func (s *hookStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	if s.claim != nil {
		if err := s.claim(ctx, req); err != nil {
			return ClaimResult{}, err
		}
	}
	return s.MemoryStore.Claim(ctx, req)
}

func (s *hookStore) Complete(ctx context.Context, f Fence, resp Response) error {
	if err := hook(s.complete, ctx, &s.completes); err != nil {
		return err
	}
	return s.MemoryStore.Complete(ctx, f, resp)
}

func (s *hookStore) Fail(ctx context.Context, f Fence) error {
	if err := hook(s.fail, ctx, &s.fails); err != nil {
		return err
	}
	return s.MemoryStore.Fail(ctx, f)
}

func (s *hookStore) Release(ctx context.Context, f Fence) error {
	if err := hook(s.release, ctx, &s.rels); err != nil {
		return err
	}
	return s.MemoryStore.Release(ctx, f)
}

func hook(h func(context.Context, int) error, ctx context.Context, n *atomic.Int64) error {
	try := int(n.Add(1))
	if h == nil {
		return nil
	}
	return h(ctx, try)
}

// newHooked returns a middleware over s with cfg (quiet, its own registry)
// unless cfg says otherwise.
func newHooked(t *testing.T, s Store, cfg Config) *Middleware {
	t.Helper()
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg.Enabled = func(*http.Request) bool { return true }
	mw, err := New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// TestMismatchCheckedBeforeStatus: a different body on a key in any state
// (in flight, stale, failed, completed without a stored body) is 422, never
// the 409 that key's state would answer to the same body.
func TestMismatchCheckedBeforeStatus(t *testing.T) {
	t.Parallel()
	for _, state := range []string{"in flight", "stale", "failed", "not stored"} {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, Config{})
			started, release := make(chan struct{}), make(chan struct{})
			rt := h.route(RouteConfig{Name: "orders", MaxResponseBytes: 4}, func(w http.ResponseWriter, r *http.Request) {
				switch state {
				case "in flight", "stale":
					close(started)
					<-release
				case "failed":
					w.WriteHeader(http.StatusInternalServerError)
					return
				}
				orderHandler(w, r) // longer than MaxResponseBytes: not stored
			})
			done := make(chan struct{})
			go func() { defer close(done); send(t, rt, "POST", "/orders", testKey, `{"a":1}`) }()
			switch state {
			case "in flight":
				<-started
			case "stale":
				<-started
				h.clock.Advance(DefaultLease + time.Second)
			default:
				<-done
			}
			w := send(t, rt, "POST", "/orders", testKey, `{"a":2}`)
			assertJSONError(t, w, 422, `{"error":"idempotency_key_body_mismatch"}`)
			// The same body gets the state's own answer: the key is in the
			// state this case is about.
			want := map[string]string{"in flight": "idempotency_in_flight", "stale": "idempotency_outcome_unknown",
				"failed": "idempotency_previous_failed", "not stored": "idempotency_response_not_stored"}[state]
			if w := send(t, rt, "POST", "/orders", testKey, `{"a":1}`); w.Code != 409 || !strings.Contains(w.Body.String(), want) {
				t.Fatalf("same body: %d %s, want 409 %s", w.Code, w.Body, want)
			}
			close(release)
			<-done
			if h.calls.Load() != 1 || counter(t, h.mw.metrics.conflicts.WithLabelValues("orders", reasonBodyMismatch)) != 1 {
				t.Fatalf("calls %d, body_mismatch %v; want 1 and 1", h.calls.Load(),
					counter(t, h.mw.metrics.conflicts.WithLabelValues("orders", reasonBodyMismatch)))
			}
		})
	}
}

// spyWriter is a ResponseWriter that records whether anything has been sent
// through it (status, body or flush).
type spyWriter struct {
	*httptest.ResponseRecorder
	sent atomic.Bool
}

func (s *spyWriter) WriteHeader(code int) { s.sent.Store(true); s.ResponseRecorder.WriteHeader(code) }
func (s *spyWriter) Write(p []byte) (int, error) {
	s.sent.Store(true)
	return s.ResponseRecorder.Write(p)
}
func (s *spyWriter) Flush() { s.sent.Store(true); s.ResponseRecorder.Flush() }

// TestRecordedBeforeSent: the outcome is recorded, then the response is
// sent, so a client retrying right after its answer gets the replay (or
// its 409), never a 409 in flight. The store's outcome call checks that
// nothing has gone out yet, for every outcome.
func TestRecordedBeforeSent(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		rc     RouteConfig
		status int
		op     string
	}{
		"completed":          {status: 201, op: "complete"},
		"failed":             {status: 500, op: "fail"},
		"released (429)":     {status: 429, op: "release"},
		"released (NoStore)": {rc: RouteConfig{NoStore: true}, status: 201, op: "release"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spy := &spyWriter{ResponseRecorder: httptest.NewRecorder()}
			var checked atomic.Int64
			check := func(context.Context, int) error {
				checked.Add(1)
				if spy.sent.Load() {
					t.Errorf("%s: the response was sent before the outcome was recorded", name)
				}
				return nil
			}
			s := &hookStore{MemoryStore: NewMemoryStore(), complete: check, fail: check, release: check}
			mw := newHooked(t, s, Config{})
			c.rc.Name = "orders"
			rt := mw.MustRoute(c.rc)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(c.status)
				_, _ = w.Write([]byte(`{"id":1}`))
			}))
			r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
			r.Header.Set(HeaderKey, testKey)
			rt.ServeHTTP(spy, r)
			if spy.Code != c.status || spy.Body.String() != `{"id":1}` {
				t.Fatalf("client got %d %s, want %d and the body", spy.Code, spy.Body, c.status)
			}
			ops := map[string]int64{"complete": s.completes.Load(), "fail": s.fails.Load(), "release": s.rels.Load()}
			if checked.Load() != 1 || ops[c.op] != 1 {
				t.Fatalf("outcome calls %v, want one %s", ops, c.op)
			}
		})
	}
}

// TestRecordRetried: a complete or a fail that the store refuses a few
// times is retried while the lease allows; the record lands and the retry
// gets its answer (the replay, or 409 previous failed), with no record
// failure counted.
func TestRecordRetried(t *testing.T) {
	t.Parallel()
	const failures = 2
	flaky := func(op string) func(context.Context, int) error {
		return func(_ context.Context, try int) error {
			if try <= failures {
				return &StoreError{Op: op, Reason: ReasonConnection, Err: errors.New("connection reset")}
			}
			return nil
		}
	}
	for _, c := range []struct {
		op     string
		status int
		want   string // of the retry
	}{
		{"complete", 201, ""},
		{"fail", 500, `{"error":"idempotency_previous_failed"}`},
	} {
		t.Run(c.op, func(t *testing.T) {
			t.Parallel()
			s := &hookStore{MemoryStore: NewMemoryStore(), complete: flaky("complete"), fail: flaky("fail")}
			mw := newHooked(t, s, Config{})
			var calls atomic.Int64
			rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(c.status)
				_, _ = w.Write([]byte(`{"id":1}`))
			}))
			if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Code != c.status {
				t.Fatalf("first: %d %s", w.Code, w.Body)
			}
			tries := map[string]int64{"complete": s.completes.Load(), "fail": s.fails.Load()}[c.op]
			if tries != failures+1 {
				t.Fatalf("%s tried %d times, want %d", c.op, tries, failures+1)
			}
			w := send(t, rt, "POST", "/orders", testKey, `{}`)
			if c.want == "" {
				if w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" || w.Body.String() != `{"id":1,"idempotency_replayed":true}` {
					t.Fatalf("retry: %d %s, want the replay", w.Code, w.Body)
				}
			} else {
				assertJSONError(t, w, 409, c.want)
			}
			if calls.Load() != 1 || testutil.ToFloat64(mw.metrics.settleFailures.WithLabelValues("orders")) != 0 ||
				testutil.ToFloat64(mw.metrics.storeErrors.WithLabelValues(c.op, ReasonConnection)) != failures {
				t.Fatalf("calls %d, record failures %v, store errors %v", calls.Load(),
					testutil.ToFloat64(mw.metrics.settleFailures.WithLabelValues("orders")),
					testutil.ToFloat64(mw.metrics.storeErrors.WithLabelValues(c.op, ReasonConnection)))
			}
		})
	}

	// A record that landed although its reply was lost: the retry finds the
	// key no longer owned in flight, which means done, not taken over.
	t.Run("reply lost", func(t *testing.T) {
		t.Parallel()
		var s *hookStore
		s = &hookStore{MemoryStore: NewMemoryStore(), complete: func(ctx context.Context, try int) error {
			if try == 1 {
				rows, _ := s.MemoryStore.ExportScope(ctx, "")
				if err := s.MemoryStore.Complete(ctx, rows[0].Fence(), Response{Status: 201, BodyKind: BodyRaw, Body: []byte("ok")}); err != nil {
					return err
				}
				return &StoreError{Op: "complete", Reason: ReasonConnection, Err: errors.New("reply lost")}
			}
			return nil
		}}
		mw := newHooked(t, s, Config{})
		rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(201)
			_, _ = w.Write([]byte("ok"))
		}))
		send(t, rt, "POST", "/orders", testKey, `{}`)
		if s.completes.Load() != 2 || testutil.ToFloat64(mw.metrics.settleFailures.WithLabelValues("orders")) != 0 {
			t.Fatalf("completes %d, record failures %v; want 2 and 0", s.completes.Load(),
				testutil.ToFloat64(mw.metrics.settleFailures.WithLabelValues("orders")))
		}
		if w := send(t, rt, "POST", "/orders", testKey, `{}`); w.Header().Get(HeaderReplayed) != "true" || w.Body.String() != "ok" {
			t.Fatalf("retry: %d %s, want the replay", w.Code, w.Body)
		}
	})
}

// TestHandlerDeadlineValue: the handler's deadline is the lease less the
// store timeout, counted from the claim (not from its answer, which a slow
// store delays).
func TestHandlerDeadlineValue(t *testing.T) {
	t.Parallel()
	const lease, storeTimeout, claimTakes = 10 * time.Second, 3 * time.Second, 50 * time.Millisecond
	var claimEntered time.Time
	s := &hookStore{MemoryStore: NewMemoryStore(), claim: func(context.Context, ClaimRequest) error {
		claimEntered = time.Now()
		time.Sleep(claimTakes) // a slow reply, not synchronisation
		return nil
	}}
	mw := newHooked(t, s, Config{Lease: lease, StoreTimeout: storeTimeout})
	var deadline time.Time
	var ok bool
	rt := mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deadline, ok = r.Context().Deadline()
	}))
	before := time.Now()
	send(t, rt, "POST", "/orders", testKey, `{}`)
	// The claim began between before and claimEntered.
	lo, hi := before.Add(lease-storeTimeout), claimEntered.Add(lease-storeTimeout)
	if !ok || deadline.Before(lo) || deadline.After(hi) {
		t.Fatalf("handler deadline %v after the request began (ok %v), want between %v and %v",
			deadline.Sub(before), ok, lo.Sub(before), hi.Sub(before))
	}
}

// TestPlusJSONIsJSON: a *+json Content-Type (problem+json, vnd.api+json)
// is JSON: stored as JSON and replayed with the replay field.
func TestPlusJSONIsJSON(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{"application/problem+json", "application/vnd.api+json; charset=utf-8"} {
		h := newHarness(t, Config{})
		rt := h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ct)
			w.WriteHeader(400)
			_, _ = w.Write([]byte(`{"type":"about:blank"}`))
		})
		send(t, rt, "POST", "/orders", testKey, `{}`)
		w := send(t, rt, "POST", "/orders", testKey, `{}`)
		if w.Code != 400 || w.Body.String() != `{"type":"about:blank","idempotency_replayed":true}` || w.Header().Get("Content-Type") != ct {
			t.Errorf("%s: replay %d %q %s", ct, w.Code, w.Header().Get("Content-Type"), w.Body)
		}
		rows, _ := h.store.ExportScope(context.Background(), "")
		if len(rows) != 1 || rows[0].Response.BodyKind != BodyJSON {
			t.Errorf("%s: stored %+v, want one JSON body", ct, rows)
		}
	}
}

// TestInformationalPassedThrough: a 1xx answer (103 Early Hints) goes out
// as it comes and is not recorded; the final status is.
func TestInformationalPassedThrough(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</app.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		orderHandler(w, r)
	})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	post := func() (int, []int) {
		var mu sync.Mutex
		var infos []int
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			mu.Lock()
			defer mu.Unlock()
			infos = append(infos, code)
			return nil
		}}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "POST", srv.URL, strings.NewReader(`{}`))
		req.Header.Set(HeaderKey, testKey)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		mu.Lock()
		defer mu.Unlock()
		return resp.StatusCode, infos
	}
	if code, infos := post(); code != 201 || len(infos) != 1 || infos[0] != 103 {
		t.Fatalf("original: %d after informational %v, want 201 after [103]", code, infos)
	}
	if code, infos := post(); code != 201 || len(infos) != 0 {
		t.Fatalf("replay: %d after informational %v, want 201 alone", code, infos)
	}
	if h.calls.Load() != 1 {
		t.Fatalf("calls %d", h.calls.Load())
	}
}

// TestNeverStoredHeaders: Date and the hop-by-hop headers can be neither
// allow-listed nor stored.
func TestNeverStoredHeaders(t *testing.T) {
	t.Parallel()
	never := []string{"Date", "Connection", "Keep-Alive", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
		"Proxy-Connection", "Content-Length", "Set-Cookie", "Authorization", "WWW-Authenticate", HeaderReplayed}
	h := newHarness(t, Config{})
	for _, name := range never {
		if _, err := h.mw.Route(RouteConfig{ReplayHeaders: []string{name}}); err == nil {
			t.Errorf("ReplayHeaders %q accepted", name)
		}
	}
	rt := h.route(RouteConfig{Name: "r", ReplayHeaders: []string{"X-Kept"}}, func(w http.ResponseWriter, r *http.Request) {
		for _, name := range never {
			w.Header().Set(name, "x")
		}
		w.Header().Set("Date", time.Now().UTC().Format(http.TimeFormat))
		w.Header().Set("X-Kept", "1")
		w.WriteHeader(201)
	})
	send(t, rt, "POST", "/r", testKey, `{}`)
	rows, _ := h.store.ExportScope(context.Background(), "")
	if len(rows) != 1 {
		t.Fatalf("%d rows", len(rows))
	}
	if got := rows[0].Response.Header; len(got) != 1 || got.Get("X-Kept") != "1" {
		t.Fatalf("stored headers %v, want X-Kept alone", got)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (a logger).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestWarnLogs: a fail-open bypass and an outcome_unknown answer each log
// one WARN line naming what happened.
func TestWarnLogs(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	h := newHarness(t, Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	warns := func(msg string) int {
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, msg) {
				n++
			}
		}
		return n
	}

	billing := h.route(RouteConfig{Name: "billing", FailOpen: true}, orderHandler)
	e := error(&StoreError{Op: "claim", Reason: ReasonConnection, Err: errors.New("connection refused")})
	h.store.fail.Store(&e)
	send(t, billing, "POST", "/billing", testKey, `{}`)
	h.store.fail.Store(nil)
	if n := warns(`msg="idempotency: store unavailable, running without deduplication"`); n != 1 || !strings.Contains(logs.String(), "endpoint=billing") {
		t.Fatalf("%d WARN lines for the bypass, want 1:\n%s", n, logs.String())
	}

	started, release := make(chan struct{}), make(chan struct{})
	orders := h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
	})
	done := make(chan struct{})
	go func() { defer close(done); send(t, orders, "POST", "/orders", testKey, `{}`) }()
	<-started
	h.clock.Advance(DefaultLease + time.Second)
	assertJSONError(t, send(t, orders, "POST", "/orders", testKey, `{}`), 409, `{"error":"idempotency_outcome_unknown"}`)
	close(release)
	<-done
	if n := warns(`msg="idempotency: stale in-flight key, outcome unknown"`); n != 1 || !strings.Contains(logs.String(), "key="+testKey) {
		t.Fatalf("%d WARN lines for outcome_unknown, want 1:\n%s", n, logs.String())
	}
}

// TestUnstorableScopeFailClosed: a scope the store could not hold is 400
// on a fail-closed route too, before any claim.
func TestUnstorableScopeFailClosed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{Scope: func(*http.Request) string { return "tenant-\xff" }})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	assertJSONError(t, send(t, rt, "POST", "/orders", testKey, `{}`), 400, `{"error":"idempotency_scope_invalid"}`)
	if h.calls.Load() != 0 || h.store.claims.Load() != 0 ||
		counter(t, h.mw.metrics.rejections.WithLabelValues("orders", reasonInvalidScope)) != 1 {
		t.Fatalf("calls %d, claims %d, or the rejection not counted", h.calls.Load(), h.store.claims.Load())
	}
}

// TestNoStoreConcurrentRetries: on a NoStore route a duplicate that arrives
// while the handler runs gets 409 in flight; once it has finished, the key
// is released and a retry executes again (no body was kept to replay).
func TestNoStoreConcurrentRetries(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	started, release := make(chan struct{}, 1), make(chan struct{})
	rt := h.route(RouteConfig{Name: "profile", NoStore: true}, func(w http.ResponseWriter, r *http.Request) {
		if h.calls.Load() == 1 {
			started <- struct{}{}
			<-release
		}
		w.WriteHeader(201)
		_, _ = w.Write([]byte("personal data"))
	})
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- send(t, rt, "POST", "/profile", testKey, `{}`) }()
	<-started
	for range 2 {
		w := send(t, rt, "POST", "/profile", testKey, `{}`)
		assertJSONError(t, w, 409, `{"error":"idempotency_in_flight","retry_after_ms":5000}`)
	}
	close(release)
	if w := <-first; w.Code != 201 || w.Body.String() != "personal data" {
		t.Fatalf("owner: %d %s", w.Code, w.Body)
	}
	w := send(t, rt, "POST", "/profile", testKey, `{}`)
	if w.Code != 201 || w.Header().Get(HeaderReplayed) != "" || h.calls.Load() != 2 {
		t.Fatalf("retry after completion: %d replayed=%q, calls %d; want a second execution", w.Code, w.Header().Get(HeaderReplayed), h.calls.Load())
	}
	if rows, _ := h.store.ExportScope(context.Background(), ""); len(rows) != 0 {
		t.Fatalf("a NoStore route left rows: %+v", rows)
	}
}

// TestOversizeStreamsThen409: a response that outgrows MaxResponseBytes
// streams (it has reached the client before the record is written); a
// duplicate that arrives before the record lands gets 409 in flight, one
// after gets 409 not stored with the original status.
func TestOversizeStreamsThen409(t *testing.T) {
	t.Parallel()
	spy := &spyWriter{ResponseRecorder: httptest.NewRecorder()}
	completing, release := make(chan struct{}), make(chan struct{})
	s := &hookStore{MemoryStore: NewMemoryStore(), complete: func(context.Context, int) error {
		if !spy.sent.Load() || spy.Body.Len() != 16 {
			t.Errorf("at the record, the client has %d bytes, want all 16 (streamed)", spy.Body.Len())
		}
		close(completing)
		<-release
		return nil
	}}
	mw := newHooked(t, s, Config{})
	rt := mw.MustRoute(RouteConfig{Name: "export", MaxResponseBytes: 8})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		_, _ = w.Write([]byte("0123456789abcdef"))
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := httptest.NewRequest("POST", "/export", strings.NewReader(`{}`))
		r.Header.Set(HeaderKey, testKey)
		rt.ServeHTTP(spy, r)
	}()
	<-completing
	assertJSONError(t, send(t, rt, "POST", "/export", testKey, `{}`), 409, `{"error":"idempotency_in_flight","retry_after_ms":5000}`)
	close(release)
	<-done
	if spy.Code != 201 || spy.Body.String() != "0123456789abcdef" {
		t.Fatalf("original: %d %q", spy.Code, spy.Body)
	}
	assertJSONError(t, send(t, rt, "POST", "/export", testKey, `{}`), 409,
		`{"error":"idempotency_response_not_stored","original_status":201}`)
	if rows, _ := s.ExportScope(context.Background(), ""); len(rows) != 1 || rows[0].Response.BodyKind != BodyNone || rows[0].Response.Body != nil {
		t.Fatalf("stored %+v, want the record without its body", rows)
	}
}

// TestNoTrailersOnReplay: trailers are not recorded; a replay carries
// neither the trailer nor its declaration.
func TestNoTrailersOnReplay(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	// X-Checksum is also a replayed header of the route: declared as a
	// trailer, its value is still a trailer and is not recorded.
	rt := h.route(RouteConfig{Name: "r", ReplayHeaders: []string{"X-Checksum"}}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "x-checksum")
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "payload")
		w.Header().Set("X-Checksum", "abc123")
		w.Header().Set(http.TrailerPrefix+"X-Late", "z")
	})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	var replay *http.Response
	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
		req.Header.Set(HeaderKey, testKey)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body) // trailers arrive after the body
		resp.Body.Close()
		replay = resp
	}
	if replay.Header.Get(HeaderReplayed) != "true" {
		t.Fatalf("second answer is not a replay: %d", replay.StatusCode)
	}
	if len(replay.Trailer) != 0 || replay.Header.Get("Trailer") != "" || replay.Header.Get("X-Checksum") != "" || replay.Header.Get("X-Late") != "" {
		t.Fatalf("replay carries trailers: trailer %v, header %v", replay.Trailer, replay.Header)
	}
}
