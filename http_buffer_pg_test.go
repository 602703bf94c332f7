package idempotency_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
)

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
