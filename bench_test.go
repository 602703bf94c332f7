package idempotency

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// discardWriter is a ResponseWriter that keeps only the status and the
// headers, so benchmarks time the middleware rather than a recorder.
type discardWriter struct {
	h    http.Header
	code int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(code int)        { d.code = code }

// check fails the benchmark unless the answer was the handler's 201, a
// replay or not as replayed says; then readies d for the next round.
func (d *discardWriter) check(b *testing.B, replayed bool) {
	if d.code != http.StatusCreated || (d.h.Get(HeaderReplayed) == "true") != replayed {
		b.Fatalf("answered %d, %s %q; want 201, replayed %v", d.code, HeaderReplayed, d.h.Get(HeaderReplayed), replayed)
	}
	d.code = 0
	clear(d.h)
}

func benchRoute(b *testing.B) http.Handler {
	mw, err := New(NewMemoryStore(), Config{Enabled: func(*http.Request) bool { return true },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	return mw.MustRoute(RouteConfig{Name: "orders"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1,"symbol":"AAPL","side":"buy","qty":10,"status":"filled","fill_price":187.42}`))
	}))
}

const benchBody = `{"symbol":"AAPL","side":"buy","qty":10}`

// benchRequest builds the request once; next readies it for another round
// (a fresh body, and the key), so the loop times the middleware rather
// than request parsing.
type benchRequest struct {
	r    *http.Request
	body strings.Reader
}

func newBenchRequest() *benchRequest {
	br := &benchRequest{r: httptest.NewRequest("POST", "/api/trading/orders", nil)}
	br.r.ContentLength = int64(len(benchBody))
	return br
}

func (br *benchRequest) next(key string) *http.Request {
	br.body.Reset(benchBody)
	br.r.Body = io.NopCloser(&br.body)
	if key == "" {
		br.r.Header.Del(HeaderKey)
	} else {
		br.r.Header.Set(HeaderKey, key)
	}
	return br.r
}

// BenchmarkPassthrough is a request without a key: the floor.
func BenchmarkPassthrough(b *testing.B) {
	rt, w, br := benchRoute(b), &discardWriter{h: http.Header{}}, newBenchRequest()
	b.ReportAllocs()
	for b.Loop() {
		rt.ServeHTTP(w, br.next(""))
		w.check(b, false)
	}
}

// BenchmarkMiss is a new key every time: claim, run, record, send.
func BenchmarkMiss(b *testing.B) {
	rt, w, br := benchRoute(b), &discardWriter{h: http.Header{}}, newBenchRequest()
	keys := make([]string, b.N+1) // fresh keys, made outside the timed loop
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		rt.ServeHTTP(w, br.next(keys[i]))
		w.check(b, false)
	}
}

// BenchmarkReplay is one key replayed.
func BenchmarkReplay(b *testing.B) {
	rt, w, br := benchRoute(b), &discardWriter{h: http.Header{}}, newBenchRequest()
	key := uuid.NewString()
	rt.ServeHTTP(w, br.next(key))
	w.check(b, false)
	b.ReportAllocs()
	for b.Loop() {
		rt.ServeHTTP(w, br.next(key))
		w.check(b, true)
	}
}
