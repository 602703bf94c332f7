package sqlstore_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
)

// TestMySQLRecordsEveryBody: every body the engine accepts is recorded on
// MariaDB and replayed byte for byte, on an ordinary and a transactional
// route: JSON nested deeper than MariaDB's JSON_VALID takes (32 levels and
// more), a lone surrogate escape (valid JSON text that JSON_VALID refuses),
// and bytes that are not UTF-8. Under migration 000001's JSON_VALID column
// checks the deep and the surrogate bodies were refused at the record: the
// order succeeded and every retry was answered 409 failed.
func TestMySQLRecordsEveryBody(t *testing.T) {
	t.Parallel()
	bodies := []struct {
		name, contentType string
		body              []byte
	}{
		{"JSON 32 levels deep", "application/json", deepJSON(32)},
		{"JSON 64 levels deep", "application/json", deepJSON(64)},
		{"a lone surrogate escape", "application/json", []byte(`{"note":"\ud800","id":1}`)},
		{"bytes", "application/octet-stream", []byte{0xff, 0x00, 0xfe, '\\', '\'', 0x80}},
		{"JSON-typed bytes that are not UTF-8", "application/json", []byte("{\"s\":\"\xff\"}")},
	}
	d := newMySQLDB(t)
	s := d.store(t, 4)
	db := d.open(t, 1)
	mw, err := idempotency.New(s, idempotency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, transactional := range []bool{false, true} {
		route, err := mw.Route(idempotency.RouteConfig{Transactional: transactional, NoReplayMarker: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bodies {
			name := b.name + " ordinary"
			if transactional {
				name = b.name + " transactional"
			}
			t.Run(name, func(t *testing.T) {
				var runs atomic.Int32
				h := route(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					runs.Add(1)
					w.Header().Set("Content-Type", b.contentType)
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write(b.body)
				}))
				key := uuid.NewString()
				for i, want := range []string{"", "true"} {
					code, body, replayed := sendOrder(t, h, key)
					if code != http.StatusCreated || !bytes.Equal(body, b.body) || replayed != want {
						t.Fatalf("request %d: %d %q (Idempotent-Replayed %q), want 201 %q (Idempotent-Replayed %q)",
							i+1, code, body, replayed, b.body, want)
					}
				}
				if n := runs.Load(); n != 1 {
					t.Fatalf("the handler ran %d times, want once", n)
				}
				var status string
				if err := db.QueryRowContext(t.Context(), `SELECT status FROM idempotency_keys WHERE idem_key = ?`, key).Scan(&status); err != nil {
					t.Fatal(err)
				}
				if status != "completed" {
					t.Fatalf("the key's row is %s, want completed", status)
				}
			})
		}
	}
}

// deepJSON is a JSON object nested depth levels deep.
func deepJSON(depth int) []byte {
	return []byte(strings.Repeat(`{"a":`, depth-1) + `{"leaf":true}` + strings.Repeat("}", depth-1))
}

// sendOrder posts one order with key and returns the answer's status,
// body and Idempotent-Replayed header.
func sendOrder(t *testing.T, h http.Handler, key string) (int, []byte, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"symbol":"AAPL"}`))
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	body, _ := io.ReadAll(w.Result().Body)
	return w.Code, body, w.Result().Header.Get(idempotency.HeaderReplayed)
}
