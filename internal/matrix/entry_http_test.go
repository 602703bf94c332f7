//go:build matrix

package matrix

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/idemkit/idempotency"
)

// serveHTTP serves h at POST /orders behind the route's middleware on a
// loopback server; the caller sends the key as Idempotency-Key.
func serveHTTP(e *env, rc idempotency.RouteConfig, h behaviour) (caller, error) {
	route, err := e.mw.Route(rc)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", route(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		status, out := h(r.Context(), &hctx{key: r.Header.Get(idempotency.HeaderKey), body: body})
		if status == statusUnsettled {
			idempotency.Unsettled(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(out)
	})))
	srv := httptest.NewServer(scopeHTTP(mux))
	e.t.Cleanup(srv.Close)
	e.addr = srv.Listener.Addr().String()
	return httpClient(e, e.addr), nil
}

// httpClient calls POST /orders on the server at addr.
func httpClient(e *env, addr string) caller {
	client := &http.Client{Transport: &http.Transport{}}
	e.t.Cleanup(client.CloseIdleConnections)
	return func(ctx context.Context, key string, body []byte) answer {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/orders", bytes.NewReader(body))
		if err != nil {
			return answer{err: err}
		}
		req.Header.Set("Content-Type", "application/json")
		// net/http resends a request with an Idempotency-Key whose
		// connection broke; without GetBody it cannot, so every answer
		// seen is the first.
		req.GetBody = nil
		if key != "" {
			req.Header.Set(idempotency.HeaderKey, key)
		}
		if s := scopeOf(ctx); s != "" {
			req.Header.Set(scopeHeader, s)
		}
		resp, err := client.Do(req)
		if err != nil {
			return answer{err: err}
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil {
			return answer{err: err}
		}
		return httpAnswer(resp, out)
	}
}

// httpAnswer reads a response: a contract answer carries {"error": code}
// with an idempotency_... code; anything else is the handler's.
func httpAnswer(resp *http.Response, body []byte) answer {
	a := answer{status: resp.StatusCode, body: body, replayed: resp.Header.Get(idempotency.HeaderReplayed) == "true"}
	a.expires, _ = http.ParseTime(resp.Header.Get(idempotency.HeaderExpires))
	var eb struct {
		Error string `json:"error"`
	}
	if resp.StatusCode >= 400 && json.Unmarshal(body, &eb) == nil && eb.Error != "" {
		a.code = eb.Error
		return a
	}
	a.handler = true
	return a
}
