package idempotency_test

// Replay fidelity over a real connection: a replay sends what the original
// sent. Found by a review pass of recorder.go.

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testdb"
)

// fidelityRoute wraps hf in a route named name over store.
func fidelityRoute(t *testing.T, store idempotency.Store, name string, hf http.HandlerFunc) http.Handler {
	t.Helper()
	mw, err := idempotency.New(store, idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet,
		Enabled: func(*http.Request) bool { return true },
	})
	if err != nil {
		t.Fatal(err)
	}
	return mw.MustRoute(idempotency.RouteConfig{Name: name})(hf)
}

type fidelityResp struct {
	status  int
	header  http.Header
	trailer http.Header
	body    string
}

// fidelitySend sends one keyed POST over a real connection and returns what
// the client saw.
func fidelitySend(t *testing.T, srv *httptest.Server, key string) fidelityResp {
	t.Helper()
	req, _ := http.NewRequest("POST", srv.URL+"/r", strings.NewReader(`{}`))
	req.Header.Set(idempotency.HeaderKey, key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return fidelityResp{resp.StatusCode, resp.Header, resp.Trailer, string(b)}
}

// TestStreamedReplayHeadersAsSent: once a response streams, its
// headers are on the wire; the record must hold those headers, not the
// handler's header map as it stands when the handler returns. Here the
// original goes out as 202 application/json without Location; the replay
// comes back as text/plain with a Location the client never saw.
func TestStreamedReplayHeadersAsSent(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, store idempotency.Store) {
		h := fidelityRoute(t, store, "r", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusAccepted)
			_ = http.NewResponseController(w).Flush() // headers are on the wire now
			// Too late to change the response (net/http ignores these):
			w.Header().Set("Location", "/late")
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, `{"id":1}`)
		})
		srv := httptest.NewServer(h)
		defer srv.Close()
		key := uuid.NewString()
		orig := fidelitySend(t, srv, key)
		replay := fidelitySend(t, srv, key)
		if replay.header.Get(idempotency.HeaderReplayed) != "true" {
			t.Fatalf("second answer is not a replay: %d %s", replay.status, replay.body)
		}
		for _, name := range []string{"Content-Type", "Location"} {
			if o, r := orig.header.Get(name), replay.header.Get(name); o != r {
				t.Errorf("%s: original sent %q, replay sends %q", name, o, r)
			}
		}
	})
}

// TestStreamedReplayContentType: a handler that flushes
// before writing (common for long-running answers) and sets no
// Content-Type sends none (net/http has nothing to sniff); the replay
// writes the whole body at once and net/http sniffs one, so the replay
// carries a Content-Type the original did not.
func TestStreamedReplayContentType(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, store idempotency.Store) {
		h := fidelityRoute(t, store, "r", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			_ = http.NewResponseController(w).Flush()
			_, _ = io.WriteString(w, "<html><body>done</body></html>")
		})
		srv := httptest.NewServer(h)
		defer srv.Close()
		key := uuid.NewString()
		orig := fidelitySend(t, srv, key)
		replay := fidelitySend(t, srv, key)
		if replay.header.Get(idempotency.HeaderReplayed) != "true" {
			t.Fatalf("second answer is not a replay: %d %s", replay.status, replay.body)
		}
		if o, r := orig.header.Values("Content-Type"), replay.header.Values("Content-Type"); strings.Join(o, ",") != strings.Join(r, ",") {
			t.Errorf("Content-Type: original sent %q, replay sends %q", o, r)
		}
	})
}

// forStores runs f as a subtest over a memory store and a Postgres one.
func forStores(t *testing.T, f func(t *testing.T, store idempotency.Store)) {
	t.Run("Memory", func(t *testing.T) { t.Parallel(); f(t, idempotency.NewMemoryStore()) })
	t.Run("Postgres", func(t *testing.T) { t.Parallel(); f(t, idempotency.NewPostgresStore(testdb.New(t))) })
}

// TestTrailersSurviveWrapping: a buffered response that declares
// trailers is sent by finish() with a Content-Length, so HTTP/1.1 cannot
// carry them: the client of the ORIGINAL request gets no trailer, and the
// trailer's value leaks as an ordinary header instead. Unwrapped, the same
// handler delivers X-Checksum as a trailer.
func TestTrailersSurviveWrapping(t *testing.T) {
	t.Parallel()
	hf := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Checksum")
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "payload")
		w.Header().Set("X-Checksum", "abc123")
	}
	plain := httptest.NewServer(http.HandlerFunc(hf))
	defer plain.Close()
	if got := fidelitySend(t, plain, uuid.NewString()); got.trailer.Get("X-Checksum") != "abc123" {
		t.Fatalf("unwrapped control: trailer %v", got.trailer)
	}
	srv := httptest.NewServer(fidelityRoute(t, idempotency.NewMemoryStore(), "r", hf))
	defer srv.Close()
	got := fidelitySend(t, srv, uuid.NewString())
	if got.trailer.Get("X-Checksum") != "abc123" {
		t.Errorf("wrapped original: trailer X-Checksum = %q (header X-Checksum = %q, Content-Length = %q)",
			got.trailer.Get("X-Checksum"), got.header.Get("X-Checksum"), got.header.Get("Content-Length"))
	}
}

// TestReplayKeepsContentEncoding: Content-Encoding describes the stored
// bytes, so it must travel with them. A gzip-encoded JSON answer used to
// replay with its Content-Type but without its Content-Encoding: the client
// got compressed bytes declared as plain JSON.
func TestReplayKeepsContentEncoding(t *testing.T) {
	t.Parallel()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = io.WriteString(zw, `{"id":1}`)
	_ = zw.Close()
	forStores(t, func(t *testing.T, store idempotency.Store) {
		h := fidelityRoute(t, store, "r", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(gz.Bytes())
		})
		srv := httptest.NewServer(h)
		defer srv.Close()
		key := uuid.NewString()
		send := func() fidelityResp {
			req, _ := http.NewRequest("POST", srv.URL+"/r", strings.NewReader(`{}`))
			req.Header.Set(idempotency.HeaderKey, key)
			req.Header.Set("Accept-Encoding", "gzip") // asked for: the client does not decode it
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return fidelityResp{resp.StatusCode, resp.Header, resp.Trailer, string(b)}
		}
		orig, replay := send(), send()
		if replay.header.Get(idempotency.HeaderReplayed) != "true" {
			t.Fatalf("second answer is not a replay: %d %q", replay.status, replay.body)
		}
		for _, name := range []string{"Content-Type", "Content-Encoding"} {
			if o, r := orig.header.Get(name), replay.header.Get(name); o != r {
				t.Errorf("%s: original sent %q, replay sends %q", name, o, r)
			}
		}
		if replay.status != orig.status || replay.body != orig.body {
			t.Errorf("replay %d %q, original %d %q: want the same bytes", replay.status, replay.body, orig.status, orig.body)
		}
	})
}
