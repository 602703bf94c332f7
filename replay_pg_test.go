package idempotency_test

import (
	"bytes"
	"compress/gzip"
	"context"
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

// TestPostgresReplayInvalidUTF8Header: headers are stored as their JSON
// encoding (encoding/json replaces an invalid byte), so a
// header value that is not valid UTF-8 replays with U+FFFD in place of each
// invalid byte (as the README says); the rest of the value is kept.
func TestPostgresReplayInvalidUTF8Header(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewPostgresStore(testdb.New(t)), idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.MustRoute(idempotency.RouteConfig{Name: "orders", ReplayHeaders: []string{"X-Note"}})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/orders/caf\xe9")
			w.Header()["X-Note"] = []string{"ok", "\xff\xfeend"}
			w.WriteHeader(http.StatusCreated)
		}))
	key := uuid.NewString()
	if w := do(h, key, `{}`); w.Code != 201 || w.Header().Get("Location") != "/orders/caf\xe9" {
		t.Fatalf("original: %d, Location %q", w.Code, w.Header().Get("Location"))
	}
	w := do(h, key, `{}`)
	if w.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("not a replay: %d %s", w.Code, w.Body)
	}
	if got := w.Header().Get("Location"); got != "/orders/caf\uFFFD" {
		t.Errorf("replayed Location %q, want %q", got, "/orders/caf\uFFFD")
	}
	if got := w.Header().Values("X-Note"); len(got) != 2 || got[0] != "ok" || got[1] != "\uFFFD\uFFFDend" {
		t.Errorf("replayed X-Note %q, want [ok \uFFFD\uFFFDend]", got)
	}
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
