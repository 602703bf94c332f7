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

// discardWriter is a ResponseWriter that keeps nothing, so benchmarks time
// the middleware rather than a recorder.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}

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

func benchRequest(key string) *http.Request {
	r := httptest.NewRequest("POST", "/api/trading/orders", strings.NewReader(benchBody))
	if key != "" {
		r.Header.Set(HeaderKey, key)
	}
	return r
}

// BenchmarkPassthrough is a request without a key: the floor.
func BenchmarkPassthrough(b *testing.B) {
	rt := benchRoute(b)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		r := benchRequest("")
		rt.ServeHTTP(w, r)
		clear(w.h)
	}
}

// BenchmarkMiss is a new key every time: claim, run, record, send.
func BenchmarkMiss(b *testing.B) {
	rt := benchRoute(b)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		r := benchRequest(uuid.NewString())
		rt.ServeHTTP(w, r)
		clear(w.h)
	}
}

// BenchmarkReplay is one key replayed.
func BenchmarkReplay(b *testing.B) {
	rt := benchRoute(b)
	w := &discardWriter{h: http.Header{}}
	key := uuid.NewString()
	rt.ServeHTTP(w, benchRequest(key))
	b.ReportAllocs()
	for b.Loop() {
		r := benchRequest(key)
		rt.ServeHTTP(w, r)
		clear(w.h)
	}
}
