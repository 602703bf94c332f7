package idempotency

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/idemclient"
)

// TestErrorForms sends every answer of the contract in both body forms and
// checks the bytes, the content type and the headers the answer carries.
func TestErrorForms(t *testing.T) {
	t.Parallel()
	const base = DefaultProblemTypeBase
	cases := []struct {
		a          answer
		original   int
		status     int
		json       string
		problem    string
		retryAfter string
		close      bool
	}{
		{answerMissingKey, 0, 400, `{"error":"Idempotency-Key header is required"}`,
			`{"type":"` + base + `idempotency_key_required","title":"Idempotency-Key header is required","status":400,"error":"Idempotency-Key header is required"}`, "", false},
		{answerInvalidKey, 0, 400, `{"error":"Idempotency-Key must be a UUID string"}`,
			`{"type":"` + base + `idempotency_key_invalid","title":"Idempotency-Key must be a UUID string","status":400,"error":"Idempotency-Key must be a UUID string"}`, "", false},
		{answerInvalidOpaqueKey, 0, 400, `{"error":"Idempotency-Key must be 1-255 characters"}`,
			`{"type":"` + base + `idempotency_key_invalid","title":"Idempotency-Key must be 1-255 characters","status":400,"error":"Idempotency-Key must be 1-255 characters"}`, "", false},
		{answerInvalidScope, 0, 400, `{"error":"idempotency_scope_invalid"}`,
			`{"type":"` + base + `idempotency_scope_invalid","title":"The request's scope or endpoint cannot be stored","status":400,"error":"idempotency_scope_invalid"}`, "", false},
		{answerBodyTooLarge, 0, 413, `{"error":"idempotency_body_too_large"}`,
			`{"type":"` + base + `idempotency_body_too_large","title":"Request body over the route's limit","status":413,"error":"idempotency_body_too_large"}`, "", true},
		{answerBodyUnreadable, 0, 400, `{"error":"idempotency_body_unreadable"}`,
			`{"type":"` + base + `idempotency_body_unreadable","title":"Request body could not be read whole","status":400,"error":"idempotency_body_unreadable"}`, "", true},
		{answerUnavailable, 0, 503, `{"error":"idempotency_store_unavailable"}`,
			`{"type":"` + base + `idempotency_store_unavailable","title":"Idempotency store unavailable; retry the same key","status":503,"error":"idempotency_store_unavailable"}`, "1", false},
		{answerInFlight, 0, 409, `{"error":"idempotency_in_flight","retry_after_ms":5000}`,
			`{"type":"` + base + `idempotency_in_flight","title":"A request with this key is in flight; retry the same key","status":409,"error":"idempotency_in_flight","retry_after_ms":5000}`, "5", false},
		{answerMismatch, 0, 422, `{"error":"idempotency_key_body_mismatch"}`,
			`{"type":"` + base + `idempotency_key_body_mismatch","title":"Idempotency-Key was used for another request","status":422,"error":"idempotency_key_body_mismatch"}`, "", false},
		{answerKeyExpired, 0, 422, `{"error":"idempotency_key_expired"}`,
			`{"type":"` + base + `idempotency_key_expired","title":"This key is past its lifetime; check the original's outcome before sending the operation again with a new key","status":422,"error":"idempotency_key_expired"}`, "", false},
		{answerPreviousFailed, 0, 409, `{"error":"idempotency_previous_failed"}`,
			`{"type":"` + base + `idempotency_previous_failed","title":"The first request with this key failed","status":409,"error":"idempotency_previous_failed"}`, "", false},
		{answerOutcomeUnknown, 0, 409, `{"error":"idempotency_outcome_unknown"}`,
			`{"type":"` + base + `idempotency_outcome_unknown","title":"The first request with this key may or may not have run; reconcile","status":409,"error":"idempotency_outcome_unknown"}`, "", false},
		{answerNotStored, 201, 409, `{"error":"idempotency_response_not_stored","original_status":201}`,
			`{"type":"` + base + `idempotency_response_not_stored","title":"The first request completed; its response was too large to store","status":409,"error":"idempotency_response_not_stored","original_status":201}`, "", false},
		{answerResponseTooLarge, 0, 500, `{"error":"idempotency_response_too_large"}`,
			`{"type":"` + base + `idempotency_response_too_large","title":"Response over the transactional route's buffer; rolled back","status":500,"error":"idempotency_response_too_large"}`, "", false},
		// A Heartbeat handler's lost lease: the store's 503, word for word.
		{answerLeaseLost, 0, 503, `{"error":"idempotency_store_unavailable"}`,
			`{"type":"` + base + `idempotency_store_unavailable","title":"Idempotency store unavailable; retry the same key","status":503,"error":"idempotency_store_unavailable"}`, "1", false},
	}
	if len(cases) != int(numAnswers) {
		t.Fatalf("%d cases for %d answers", len(cases), numAnswers)
	}
	for _, format := range []ErrorFormat{ErrorJSON, ErrorProblem} {
		h := newHarness(t, Config{ErrorFormat: format})
		rt, err := h.mw.newRoute(RouteConfig{Name: "orders"})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			w := httptest.NewRecorder()
			rq := rt.newRequest(w, httptest.NewRequest("POST", "/orders", nil))
			rq.name()
			rq.answerWith(c.a, c.original)
			want, ct := c.json, "application/json"
			if format == ErrorProblem {
				want, ct = c.problem, "application/problem+json"
			}
			if w.Code != c.status || w.Body.String() != want || w.Header().Get("Content-Type") != ct {
				t.Errorf("format %d answer %d: %d %s %q, want %d %s %q", format, c.a, w.Code, w.Body, w.Header().Get("Content-Type"), c.status, want, ct)
			}
			if w.Header().Get("Retry-After") != c.retryAfter || (w.Header().Get("Connection") == "close") != c.close {
				t.Errorf("format %d answer %d: headers %v", format, c.a, w.Header())
			}
			if w.Header().Get("Content-Length") != itoa(len(want)) {
				t.Errorf("format %d answer %d: Content-Length %q for %d bytes", format, c.a, w.Header().Get("Content-Length"), len(want))
			}
			// The client package finds the code in either form.
			resp := w.Result()
			if e := idemclient.ErrorFrom(resp); e == nil || e.Status != c.status || e.Code != answers[c.a].code {
				t.Errorf("format %d answer %d: idemclient read %+v", format, c.a, e)
			}
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestErrorProblemEndToEnd answers a real in-flight duplicate with
// problem+json under a custom type base, and idemclient reads its code
// from the type URI alone when the "error" member is missing.
func TestErrorProblemEndToEnd(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{ErrorFormat: ErrorProblem, ProblemTypeBase: "https://errors.example.com/"})
	release, started := make(chan struct{}), make(chan struct{})
	rt := h.route(RouteConfig{Name: "orders"}, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		orderHandler(w, r)
	})
	done := make(chan struct{})
	go func() { send(t, rt, "POST", "/orders", testKey, `{"a":1}`); close(done) }()
	<-started
	w := send(t, rt, "POST", "/orders", testKey, `{"a":1}`)
	close(release)
	<-done
	want := `{"type":"https://errors.example.com/idempotency_in_flight","title":"A request with this key is in flight; retry the same key","status":409,"error":"idempotency_in_flight","retry_after_ms":5000}`
	if w.Code != 409 || w.Body.String() != want || w.Header().Get("Retry-After") != "5" {
		t.Fatalf("got %d %s %v", w.Code, w.Body, w.Header())
	}
	// Without the extension member, the type URI still names the code.
	resp := &http.Response{StatusCode: 409, Header: http.Header{"Content-Type": {"application/problem+json"}},
		Body: io.NopCloser(strings.NewReader(`{"type":"https://errors.example.com/idempotency_in_flight","status":409}`))}
	if e := idemclient.ErrorFrom(resp); e == nil || e.Code != idemclient.CodeInFlight {
		t.Fatalf("idemclient read %+v from the type URI", e)
	}
}

// TestErrorWriter replaces both forms with the host's own error body.
func TestErrorWriter(t *testing.T) {
	t.Parallel()
	var got []ErrorAnswer
	h := newHarness(t, Config{ErrorFormat: ErrorProblem, ErrorWriter: func(w http.ResponseWriter, r *http.Request, e ErrorAnswer) {
		if r.URL.Path != "/orders" {
			t.Errorf("writer got request %s", r.URL.Path)
		}
		got = append(got, e)
		w.Header().Set("Content-Type", "application/vnd.host+json")
		w.WriteHeader(e.Status)
		_, _ = io.WriteString(w, `{"code":"`+e.Code+`"}`)
	}})
	rt := h.route(RouteConfig{Name: "orders", MaxResponseBytes: 8}, orderHandler)
	w := send(t, rt, "POST", "/orders", "not-a-key", `{}`)
	if w.Code != 400 || w.Body.String() != `{"code":"Idempotency-Key must be a UUID string"}` || w.Header().Get("Content-Type") != "application/vnd.host+json" {
		t.Fatalf("invalid key: %d %s %v", w.Code, w.Body, w.Header())
	}
	send(t, rt, "POST", "/orders", testKey, `{}`)
	w = send(t, rt, "POST", "/orders", testKey, `{}`)
	if w.Code != 409 || w.Body.String() != `{"code":"idempotency_response_not_stored"}` {
		t.Fatalf("not stored: %d %s", w.Code, w.Body)
	}
	want := ErrorAnswer{Status: 409, Code: "idempotency_response_not_stored", Kind: "idempotency_response_not_stored", Type: DefaultProblemTypeBase + "idempotency_response_not_stored",
		Title: answers[answerNotStored].title, OriginalStatus: 201}
	if len(got) == 2 && got[1].Expires.IsZero() {
		t.Fatal("the not-stored answer does not advertise its row's expiry")
	}
	if len(got) == 2 {
		got[1].Expires = time.Time{} // TestErrorWriterGetsExpires checks its value
	}
	if len(got) != 2 || got[1] != want {
		t.Fatalf("writer got %+v, want second %+v", got, want)
	}
	if counter(t, h.mw.metrics.conflicts.WithLabelValues("orders", "not_stored")) != 1 {
		t.Fatal("an answer written by ErrorWriter was not counted")
	}
}

// TestNoReplayMarker turns the body marker off on one route; the header
// stays.
func TestNoReplayMarker(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	for _, c := range []struct {
		off  bool
		want string
	}{
		{false, `{"idempotency_replayed":true,"id":1,"echo":"{}"}`},
		{true, `{"id":1,"echo":"{}"}`},
	} {
		rt := h.route(RouteConfig{Name: "orders", NoReplayMarker: c.off}, orderHandler)
		key := testKey
		if c.off {
			key = testKey2
		}
		send(t, rt, "POST", "/orders", key, `{}`)
		w := send(t, rt, "POST", "/orders", key, `{}`)
		if w.Code != 201 || w.Body.String() != c.want || w.Header().Get(HeaderReplayed) != "true" {
			t.Fatalf("NoReplayMarker %v: %d %s replayed %q", c.off, w.Code, w.Body, w.Header().Get(HeaderReplayed))
		}
	}
}

// TestProblemTypeBaseValidated refuses a base whose URIs could not end
// with the code, or whose text would need escaping.
func TestProblemTypeBaseValidated(t *testing.T) {
	t.Parallel()
	for _, base := range []string{"errors/", "https://e.example/x", "https://e.example/\"q\"/", "https://e.example/é/", "https://e xample/"} {
		if _, err := New(NewMemoryStore(), Config{ProblemTypeBase: base}); err == nil || !strings.Contains(err.Error(), "ProblemTypeBase") {
			t.Errorf("base %q: err %v", base, err)
		}
	}
	for _, base := range []string{"https://e.example/problems/", "https://e.example/doc#", "urn:example:problem:"} {
		if _, err := New(NewMemoryStore(), Config{ProblemTypeBase: base}); err != nil {
			t.Errorf("base %q: %v", base, err)
		}
	}
	if _, err := New(NewMemoryStore(), Config{ErrorFormat: 7}); err == nil {
		t.Error("ErrorFormat 7 accepted")
	}
}

// TestProblemTypesDocumented: every problem type URI under the default
// base lands on an anchor in README's "Error bodies".
func TestProblemTypesDocumented(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for a := range numAnswers {
		if code := answers[a].problem; !strings.Contains(string(readme), `<a id="`+code+`"></a>`) {
			t.Errorf("README.md has no anchor for the problem type %s", code)
		}
	}
}
