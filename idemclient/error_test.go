package idemclient

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
)

// TestErrorFrom reads the code from the fixed JSON body and from
// problem+json (its "error" member, else its type URI), and puts the body
// back.
func TestErrorFrom(t *testing.T) {
	t.Parallel()
	const problem = "application/problem+json"
	long := `{"error":"idempotency_in_flight","pad":"` + strings.Repeat("x", 2*maxErrorBody) + `"}`
	for _, tc := range []struct {
		name string
		resp *http.Response
		want *Error
	}{
		{"nil", nil, nil},
		{"201", answer(201, "application/json", `{"error":"not an error"}`), nil},
		{"304", answer(304, "", ``), nil},
		{"fixed JSON", answer(409, "application/json", `{"error":"idempotency_previous_failed"}`), &Error{409, CodePreviousFailed}},
		{"fixed JSON, extra fields", answer(409, "application/json", `{"error":"idempotency_response_not_stored","original_status":201}`), &Error{409, CodeResponseNotStored}},
		{"handler's own", answer(400, "application/json", `{"error":"invalid_order","message":"qty must be positive"}`), &Error{400, "invalid_order"}},
		{"problem+json, error member", answer(422, problem, `{"type":"https://idemkit.dev/problems/other","status":422,"title":"Key reused","error":"idempotency_key_body_mismatch"}`), &Error{422, CodeKeyBodyMismatch}},
		{"problem+json, type only", answer(409, problem+"; charset=utf-8", `{"type":"https://idemkit.dev/problems/idempotency-outcome-unknown","status":409}`), &Error{409, CodeOutcomeUnknown}},
		{"problem+json, fragment type", answer(503, problem, `{"type":"https://idemkit.dev/errors#idempotency_store_unavailable"}`), &Error{503, CodeStoreUnavailable}},
		{"problem+json, about:blank", answer(404, problem, `{"type":"about:blank","title":"Not Found"}`), &Error{404, ""}},
		{"problem+json, foreign type", answer(400, problem, `{"type":"https://example.com/probs/out-of-credit"}`), &Error{400, ""}},
		{"error not a string", answer(400, "application/json", `{"error":{"code":"x"}}`), &Error{400, ""}},
		{"not JSON", answer(502, "text/html", `<html>{"error":"idempotency_in_flight"}</html>`), &Error{502, ""}},
		{"broken JSON", answer(500, "application/json", `{"error":`), &Error{500, ""}},
		{"no content type", answer(429, "", `{"error":"slow_down"}`), &Error{429, ""}},
		{"over the peek limit", answer(409, "application/json", long), &Error{409, ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want string
			if tc.resp != nil {
				raw, _ := io.ReadAll(tc.resp.Body)
				want = string(raw)
				tc.resp.Body = io.NopCloser(strings.NewReader(want))
			}
			got := ErrorFrom(tc.resp)
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Fatalf("ErrorFrom = %#v, want %#v", got, tc.want)
			}
			if tc.resp == nil {
				return
			}
			if rest, _ := io.ReadAll(tc.resp.Body); string(rest) != want {
				t.Fatalf("body after ErrorFrom: %d bytes, want the %d bytes of the answer", len(rest), len(want))
			}
		})
	}
}

// TestErrorFromReadError: a body that fails part-way still reports the
// failure to the reader that reads it after ErrorFrom.
func TestErrorFromReadError(t *testing.T) {
	t.Parallel()
	boom := errors.New("connection reset")
	resp := answer(409, "application/json", "")
	resp.Body = io.NopCloser(io.MultiReader(strings.NewReader(`{"error":"idempo`), iotest.ErrReader(boom)))
	if e := ErrorFrom(resp); e == nil || e.Code != "" || e.Status != 409 {
		t.Fatalf("ErrorFrom = %#v, want status 409 and no code", e)
	}
	got, err := io.ReadAll(resp.Body)
	if string(got) != `{"error":"idempo` || !errors.Is(err, boom) {
		t.Fatalf("body after ErrorFrom = %q, %v; want the bytes before the failure, then the failure", got, err)
	}
}

func TestErrorString(t *testing.T) {
	t.Parallel()
	if got := (&Error{409, CodeOutcomeUnknown}).Error(); got != "idemclient: status 409: idempotency_outcome_unknown" {
		t.Errorf("Error() = %q", got)
	}
	if got := (&Error{502, ""}).Error(); got != "idemclient: status 502" {
		t.Errorf("Error() = %q", got)
	}
}

func TestNewKey(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		k := NewKey()
		if len(k) != 36 || k[8] != '-' || k[13] != '-' || k[18] != '-' || k[23] != '-' || k[14] != '4' || !strings.ContainsRune("89ab", rune(k[19])) || strings.ToLower(k) != k {
			t.Fatalf("NewKey() = %q, not a lower-case version 4 UUID", k)
		}
		if seen[k] {
			t.Fatalf("NewKey() repeated %q", k)
		}
		seen[k] = true
	}
}
