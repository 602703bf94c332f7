package idemopenapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
	idemopenapi "github.com/idemkit/idempotency/contrib/openapi"
)

// waitLimit bounds every wait of these tests on the middleware (its store
// timeout is 2s): a hang fails by name.
const waitLimit = 30 * time.Second

// thingsDoc is a document with POST /things and POST /full, both the same
// operation: the handler's 201 and 500, and the contract of cfg and rc.
func thingsDoc(t *testing.T, cfg idempotency.Config, rc idempotency.RouteConfig, opts ...idemopenapi.Option) *openapi3.T {
	t.Helper()
	op := &openapi3.Operation{OperationID: "createThing", Responses: openapi3.NewResponses()}
	thing := openapi3.NewObjectSchema().WithProperty("id", openapi3.NewIntegerSchema())
	thing.Required = []string{"id"}
	op.Responses.Set("201", &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("Created.").WithJSONSchema(thing)})
	boom := openapi3.NewObjectSchema().WithProperty("error", openapi3.NewStringSchema().WithEnum("boom"))
	boom.Required = []string{"error"}
	op.Responses.Set("500", &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("Failed.").WithJSONSchema(boom)})
	if err := idemopenapi.Operation(op, cfg, rc, opts...); err != nil {
		t.Fatalf("Operation: %v", err)
	}
	doc := &openapi3.T{OpenAPI: "3.0.3", Info: &openapi3.Info{Title: "things", Version: "1"}, Paths: openapi3.NewPaths()}
	doc.Paths.Set("/things", &openapi3.PathItem{Post: op})
	full := *op
	full.OperationID = "createThingInAFullStore"
	doc.Paths.Set("/full", &openapi3.PathItem{Post: &full})
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the document is not valid: %v", err)
	}
	return doc
}

// thingsServer serves POST /things through a route of cfg and rc on a
// memory store, and POST /full through one whose store holds one row.
// The handler answers by the body: "ok" 201, "fail" 500, "big" a 201 over
// 64 bytes, "block" waits for release after closing started.
func thingsServer(t *testing.T, cfg idempotency.Config, rc idempotency.RouteConfig) (base string, started, release chan struct{}) {
	t.Helper()
	started, release = make(chan struct{}), make(chan struct{})
	var once bool
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case bytes.Contains(b, []byte("fail")):
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"error":"boom"}`))
			return
		case bytes.Contains(b, []byte("block")) && !once:
			once = true
			close(started)
			select {
			case <-release:
			case <-time.After(waitLimit):
			}
		}
		w.WriteHeader(http.StatusCreated)
		if bytes.Contains(b, []byte("big")) {
			_, _ = w.Write([]byte(`{"id":1,"pad":"` + strings.Repeat("x", 100) + `"}`))
			return
		}
		_, _ = w.Write([]byte(`{"id":1}`))
	})
	mux := http.NewServeMux()
	for path, store := range map[string]idempotency.Store{
		"POST /things": idempotency.NewMemoryStore(),
		"POST /full":   idempotency.NewMemoryStore(idempotency.MemoryMaxRows(1)),
	} {
		m, err := idempotency.New(store, cfg)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		route, err := m.Route(rc)
		if err != nil {
			t.Fatalf("Route: %v", err)
		}
		mux.Handle(path, route(h))
	}
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	return ts.URL, started, release
}

// call sends POST base+path with key (none when "") and body, and checks
// the answer against doc; it returns the answer's status and "error" member.
func call(t *testing.T, doc *openapi3.T, base, path, key, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read the answer: %v", path, err)
	}
	if err := checkResponse(doc, req, resp, got); err != nil {
		t.Errorf("POST %s (key %q, body %s) answered %d %s %s, which the document does not declare: %v",
			path, key, body, resp.StatusCode, resp.Header, got, err)
	}
	var e struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(got, &e)
	return resp.StatusCode, e.Error
}

// checkResponse validates the answer resp (body) to req against doc: its
// status must be declared, its headers and body must match the declaration.
func checkResponse(doc *openapi3.T, req *http.Request, resp *http.Response, body []byte) error {
	router, err := legacy.NewRouter(doc)
	if err != nil {
		return err
	}
	route, params, err := router.FindRoute(req)
	if err != nil {
		return err
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(body)
	return openapi3filter.ValidateResponse(context.Background(), in)
}

// TestAnswersMatchTheMiddleware drives a real Middleware into each of its
// answers, in each error format, and validates every answer against the
// document Operation declares for the route: a status, header or body the
// middleware sends and the document does not declare fails.
func TestAnswersMatchTheMiddleware(t *testing.T) {
	t.Parallel()
	custom := openapi3.NewObjectSchema().WithProperty("code", openapi3.NewStringSchema())
	custom.Required = []string{"code"}
	formats := []struct {
		name string
		cfg  idempotency.Config
		opts []idemopenapi.Option
	}{
		{"json", idempotency.Config{}, nil},
		{"problem", idempotency.Config{ErrorFormat: idempotency.ErrorProblem}, nil},
		{"custom", idempotency.Config{ErrorWriter: func(w http.ResponseWriter, _ *http.Request, e idempotency.ErrorAnswer) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(e.Status)
			_, _ = w.Write([]byte(`{"code":"` + e.Code + `"}`))
		}}, []idemopenapi.Option{idemopenapi.ErrorSchema("application/json", custom.NewRef())}},
	}
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			rc := idempotency.RouteConfig{RequireKey: true, MaxBodyBytes: 32, MaxResponseBytes: 64}
			doc := thingsDoc(t, f.cfg, rc, f.opts...)
			base, started, release := thingsServer(t, f.cfg, rc)
			want := func(status int, code string, gotStatus int, gotCode string) {
				t.Helper()
				if gotStatus != status || (f.name != "custom" && gotCode != code) {
					t.Errorf("answered %d %q, want %d %q", gotStatus, gotCode, status, code)
				}
			}
			key := uuid.NewString()
			s, c := call(t, doc, base, "/things", key, `{"do":"ok"}`)
			want(201, "", s, c)
			s, c = call(t, doc, base, "/things", key, `{"do":"ok"}`) // the replay
			want(201, "", s, c)
			s, c = call(t, doc, base, "/things", key, `{"do":"ok!"}`)
			want(422, "idempotency_key_body_mismatch", s, c)
			s, c = call(t, doc, base, "/things", "", `{"do":"ok"}`)
			want(400, "Idempotency-Key header is required", s, c)
			s, c = call(t, doc, base, "/things", "not-a-uuid", `{"do":"ok"}`)
			want(400, "Idempotency-Key must be a UUID string", s, c)
			s, c = call(t, doc, base, "/things", uuid.NewString(), `{"do":"`+strings.Repeat("x", 64)+`"}`)
			want(413, "idempotency_body_too_large", s, c)

			failed := uuid.NewString()
			s, c = call(t, doc, base, "/things", failed, `{"do":"fail"}`)
			want(500, "boom", s, c)
			s, c = call(t, doc, base, "/things", failed, `{"do":"fail"}`)
			want(409, "idempotency_previous_failed", s, c)

			big := uuid.NewString()
			s, c = call(t, doc, base, "/things", big, `{"do":"big"}`)
			want(201, "", s, c)
			s, c = call(t, doc, base, "/things", big, `{"do":"big"}`)
			want(409, "idempotency_response_not_stored", s, c)

			blocked, done := uuid.NewString(), make(chan error, 1)
			go func() { // not call: no t.Fatal off the test's goroutine
				req, _ := http.NewRequest(http.MethodPost, base+"/things", strings.NewReader(`{"do":"block"}`))
				req.Header.Set("Idempotency-Key", blocked)
				resp, err := (&http.Client{Timeout: waitLimit}).Do(req)
				if err == nil {
					resp.Body.Close()
				}
				done <- err
			}()
			select {
			case <-started:
			case <-time.After(waitLimit):
				t.Fatal("the blocking request never reached the handler")
			}
			s, c = call(t, doc, base, "/things", blocked, `{"do":"block"}`)
			want(409, "idempotency_in_flight", s, c)
			close(release)
			if err := <-done; err != nil {
				t.Errorf("the blocked request: %v", err)
			}

			s, c = call(t, doc, base, "/full", uuid.NewString(), `{"do":"ok"}`)
			want(201, "", s, c)
			s, c = call(t, doc, base, "/full", uuid.NewString(), `{"do":"ok"}`) // the store is full
			want(503, "idempotency_store_unavailable", s, c)
		})
	}
}
