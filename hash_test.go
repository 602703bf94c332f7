package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/internal/jcs"
	"github.com/idemkit/idempotency/internal/jcs/jcsvectors"
)

// updateHashVectors rewrites the hash fields of the golden vectors from the
// implementation. Only use it after checking the canonical forms, which are
// written by hand and never rewritten.
var updateHashVectors = flag.Bool("update-hash-vectors", false, "rewrite the hashes in "+hashVectorsFile)

const hashVectorsFile = "testdata/hash_vectors.json"

// TestHashVectors checks every golden vector's hash, so a change that would
// make stored keys answer 422 to their own retries fails here (the
// canonical forms are checked in internal/jcs).
func TestHashVectors(t *testing.T) {
	vs := jcsvectors.Load(t, hashVectorsFile)
	if *updateHashVectors {
		for k := range vs {
			vs[k].Hash = requestHash(vs[k].Method, vs[k].Path, vs[k].Query, vs[k].Bytes(t))
		}
		jcsvectors.Write(t, hashVectorsFile, vs)
	}
	t.Parallel()
	hexHash := regexp.MustCompile(`^[0-9a-f]{64}$`)
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			body := v.Bytes(t)
			h := requestHash(v.Method, v.Path, v.Query, body)
			if !hexHash.MatchString(h) {
				t.Errorf("requestHash = %q, want 64 lower-case hex characters", h)
			}
			if h != v.Hash {
				t.Errorf("requestHash = %s, want %s", h, v.Hash)
			}
			if want := referenceHash(v.Method, v.Path, v.Query, v.Canonical, body); h != want {
				t.Errorf("requestHash = %s, the documented framing gives %s", h, want)
			}
		})
	}
}

// referenceHash spells out the framing documented on hashRequest, so the
// golden hashes are pinned to the documentation and not only to the code.
func referenceHash(method, path, query string, canonical *string, body []byte) string {
	kind, payload := "raw", body
	if canonical != nil {
		kind, payload = "json", []byte(*canonical)
	}
	var msg []byte
	for _, field := range []string{method, path, query, kind} {
		msg = binary.BigEndian.AppendUint64(msg, uint64(len(field)))
		msg = append(msg, field...)
	}
	sum := sha256.Sum256(append(msg, payload...))
	return hex.EncodeToString(sum[:])
}

// TestHashVectorsDistinct checks that vectors hash alike exactly when they
// are marked same_as: another path, query, method or body (raw or JSON) must
// never share a hash, while two encodings of one JSON value must.
func TestHashVectorsDistinct(t *testing.T) {
	t.Parallel()
	vs := jcsvectors.Load(t, hashVectorsFile)
	group := make(map[string]string, len(vs)) // vector name -> same_as root
	for _, v := range vs {
		group[v.Name] = v.Name
		if v.SameAs != "" {
			group[v.Name] = v.SameAs
		}
	}
	for a, va := range vs {
		for _, vb := range vs[a+1:] {
			same := group[va.Name] == group[vb.Name]
			if same && va.Hash != vb.Hash {
				t.Errorf("%s and %s: hashes differ, want equal", va.Name, vb.Name)
			}
			if !same && va.Hash == vb.Hash {
				t.Errorf("%s and %s: hashes are equal, want different", va.Name, vb.Name)
			}
		}
	}
	for _, v := range vs {
		if _, ok := group[v.SameAs]; v.SameAs != "" && !ok {
			t.Errorf("%s: same_as names no vector: %q", v.Name, v.SameAs)
		}
	}
}

// TestRequestHashRawNeverMatchesJSON checks the distinct prefix: the raw
// framing of bytes that equal a canonical JSON text (as a body too deep to be
// JSON can) never hashes like that JSON body.
func TestRequestHashRawNeverMatchesJSON(t *testing.T) {
	t.Parallel()
	for _, v := range jcsvectors.Load(t, hashVectorsFile) {
		if v.Canonical == nil {
			continue
		}
		raw := hashRequest(v.Method, v.Path, v.Query, hashKindRaw, []byte(*v.Canonical))
		if raw == v.Hash {
			t.Errorf("%s: the raw framing of the canonical text hashes like the JSON body", v.Name)
		}
	}
}

// TestRequestHashDeepNesting checks that a body nested far beyond the
// canonicaliser's limit is hashed raw: returning at all is the proof, the
// bound only keeps a regression from hanging the run.
func TestRequestHashDeepNesting(t *testing.T) {
	t.Parallel()
	const depth = 200_000
	for _, body := range []string{strings.Repeat("[", depth), strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)} {
		done := make(chan string, 1)
		go func() { done <- requestHash("POST", "/", "", []byte(body)) }()
		select {
		case h := <-done:
			if want := hashRequest("POST", "/", "", hashKindRaw, []byte(body)); h != want {
				t.Errorf("requestHash = %s, want the raw hash %s", h, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("requestHash of a body nested 200,000 deep did not return")
		}
	}
}

// TestFoldAlikeNamesAreAnotherRequest: a handler decoding with
// encoding/json matches member names case-insensitively, last match wins,
// so {"qty":1,"QTY":1000} orders 1000 and {"QTY":1000,"qty":1} orders 1.
// The second sent under the first's key must get 422, not the first's
// replay; both used to canonicalise to one text and so one hash.
func TestFoldAlikeNamesAreAnotherRequest(t *testing.T) {
	t.Parallel()
	first, second := `{"qty":1,"QTY":1000}`, `{"QTY":1000,"qty":1}`
	var order struct{ Qty int }
	for body, want := range map[string]int{first: 1000, second: 1} {
		if err := json.Unmarshal([]byte(body), &order); err != nil || order.Qty != want {
			t.Fatalf("encoding/json decodes %s to qty %d (%v), the premise says %d", body, order.Qty, err, want)
		}
	}
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "orders"}, orderHandler)
	if w := send(t, rt, "POST", "/orders", testKey, first); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	w := send(t, rt, "POST", "/orders", testKey, second)
	assertJSONError(t, w, http.StatusUnprocessableEntity, `{"error":"idempotency_key_body_mismatch"}`)
	if h.calls.Load() != 1 {
		t.Fatalf("calls = %d, want 1", h.calls.Load())
	}
}

// BenchmarkRequestHash measures the per-request cost of hashing a typical
// order body whose members are not yet in canonical order.
func BenchmarkRequestHash(b *testing.B) {
	body := []byte(`{"symbol":"AAPL","side":"buy","qty":10,"type":"limit","limit_price":"187.25",` +
		`"time_in_force":"day","account":"PA-0001234","note":"rebalance Q3 tech sleeve","extended_hours":false}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		requestHash("POST", "/api/trading/orders", "", body)
	}
}

// BenchmarkRequestHashSorted measures the same body already in canonical
// order, the path that moves no members.
func BenchmarkRequestHashSorted(b *testing.B) {
	body, ok := jcs.Canonical([]byte(`{"symbol":"AAPL","side":"buy","qty":10,"type":"limit","limit_price":"187.25",` +
		`"time_in_force":"day","account":"PA-0001234","note":"rebalance Q3 tech sleeve","extended_hours":false}`))
	if !ok {
		b.Fatal("jcs.Canonical rejected the benchmark body")
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		requestHash("POST", "/api/trading/orders", "", body)
	}
}

// TestDeepNesting: hashing a body nested 200,000 levels deep stays bounded
// and answers below 500.
func TestDeepNesting(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "r", MaxBodyBytes: 1 << 20}, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(400)
	})
	body := strings.Repeat("[", 200000) + strings.Repeat("]", 200000)
	w := send(t, rt, "POST", "/r", testKey, body)
	if w.Code >= 500 {
		t.Fatalf("status %d", w.Code)
	}
	if w := send(t, rt, "POST", "/r", testKey, body); w.Code != 400 || w.Header().Get(HeaderReplayed) != "true" {
		t.Fatalf("replay of deep body: %d", w.Code)
	}
}

// TestContentTypeIsNotHashed: the request hash covers the method, path,
// query and body, no header: the same bytes under another Content-Type are
// the same request (the replay), and a JSON body is canonicalised whatever
// Content-Type it came with.
func TestContentTypeIsNotHashed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	route := h.route(RouteConfig{Name: "orders"}, orderHandler)
	const key = "5a0c9e2d-8a7b-4c6d-9e1f-2a3b4c5d6e7f"
	if w := send(t, route, "POST", "/orders", key, `{"qty":1,"sym":"A"}`, "Content-Type", "application/json"); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	w := send(t, route, "POST", "/orders", key, `{ "sym": "A", "qty": 1 }`, "Content-Type", "text/plain")
	if w.Code != http.StatusCreated || w.Header().Get(HeaderReplayed) != "true" || h.calls.Load() != 1 {
		t.Fatalf("same JSON as text/plain: %d replayed %q, handler ran %d times; want the replay", w.Code, w.Header().Get(HeaderReplayed), h.calls.Load())
	}
}
