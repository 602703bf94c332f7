package idempotency

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestResponseControllerDeadlines: behind the middleware a handler's
// http.ResponseController can set the connection's read and write
// deadlines and enable full duplex (they change no bytes), while its
// response stays buffered and is recorded and replayed as usual. Before,
// each answered http.ErrNotSupported: the buffer hid the connection.
func TestResponseControllerDeadlines(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	errs := make(chan error, 3)
	rt := h.route(RouteConfig{Name: "deadlines"}, func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		errs <- rc.SetReadDeadline(time.Now().Add(time.Minute))
		errs <- rc.SetWriteDeadline(time.Now().Add(time.Minute))
		errs <- rc.EnableFullDuplex()
		orderHandler(w, r)
	})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	for i, name := range []string{"first", "replay"} {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
		req.Header.Set(HeaderKey, testKey)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || (resp.Header.Get(HeaderReplayed) == "true") != (i == 1) {
			t.Errorf("%s: %d (replayed %q) %s", name, resp.StatusCode, resp.Header.Get(HeaderReplayed), body)
		}
	}
	close(errs)
	n := 0
	for err := range errs {
		n++
		if err != nil {
			t.Errorf("call %d of the handler's ResponseController: %v", n, err)
		}
	}
	if n != 3 || h.calls.Load() != 1 {
		t.Errorf("%d controller calls, %d executions; want 3 and 1", n, h.calls.Load())
	}
}

// TestWriteDeadlineReachesTheConnection: the write deadline a handler sets
// is the connection's: one already past makes the response's write fail,
// so the client sees the connection close instead of an answer.
func TestWriteDeadlineReachesTheConnection(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	rt := h.route(RouteConfig{Name: "deadline-past"}, func(w http.ResponseWriter, r *http.Request) {
		if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(-time.Second)); err != nil {
			t.Errorf("SetWriteDeadline: %v", err)
		}
		orderHandler(w, r)
	})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
	req.Header.Set(HeaderKey, testKey)
	resp, err := srv.Client().Do(req)
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("the answer arrived (%d %s) although the handler's write deadline had passed", resp.StatusCode, body)
	}
}
