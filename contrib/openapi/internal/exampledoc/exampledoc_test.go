package exampledoc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/google/uuid"
)

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../../../.."

// committed is the document the example server embeds and serves.
var committed = filepath.Join(repoRoot, "examples", "server", "openapi.json")

// inRepository skips a test that needs the repository around this module
// (the example server, its committed document): the module's zip, as the
// proxy serves it, has neither.
func inRepository(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(repoRoot, "examples", "server", "main.go")); err != nil {
		t.Skipf("not in the repository's checkout: %v", err)
	}
}

// waitLimit bounds every wait on the example server: a hang fails by name.
const waitLimit = 30 * time.Second

// TestExampleDocumentIsCurrent: the example server embeds exactly what
// this package generates, and it is a valid OpenAPI 3.0.3 document.
func TestExampleDocumentIsCurrent(t *testing.T) {
	inRepository(t)
	want, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(committed)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not the generated document: run `go run ./cmd/exampledoc > ../../examples/server/openapi.json` in contrib/openapi", committed)
	}
	doc, err := Document()
	if err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.0.3" {
		t.Fatalf("openapi %q", doc.OpenAPI)
	}
}

// exampleServer builds and starts the example server in memory mode, and
// returns its base URL.
func exampleServer(t *testing.T) string {
	t.Helper()
	inRepository(t)
	if testing.Short() {
		t.Skip("builds and runs the example server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "server")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./examples/server")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/server: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0")
	for _, kv := range os.Environ() { // memory mode, defaults: none of the server's settings
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "DATABASE_URL", name == "ADDR", strings.HasPrefix(name, "MBT_"),
			strings.HasPrefix(name, "IDEMPOTENCY_"), strings.HasPrefix(name, "FLAG_"), strings.HasPrefix(name, "SEAL"):
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(waitLimit):
			_ = cmd.Process.Kill()
			t.Error("the example server did not stop within the wait limit after SIGTERM")
			<-exited
		}
	})
	addr := make(chan string, 1)
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addr <- line.Addr
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case a := <-addr:
		return "http://" + a
	case <-exited:
		t.Fatal("the example server exited before listening")
	case <-time.After(waitLimit):
		t.Fatal("the example server did not log \"listening\" within the wait limit")
	}
	return ""
}

// exchange is one request to the example server and its answer.
type exchange struct {
	method, path, token, key, body string
}

// answer is what send returns.
type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    []byte
}

// send sends x and checks the answer against doc; with validRequest, the
// request must match doc too.
func send(t *testing.T, doc *openapi3.T, base string, x exchange, validRequest bool) answer {
	t.Helper()
	newReq := func(ctx context.Context) *http.Request {
		r, err := http.NewRequestWithContext(ctx, x.method, base+x.path, strings.NewReader(x.body))
		if err != nil {
			t.Fatal(err)
		}
		if x.body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		if x.token != "" {
			r.Header.Set("Authorization", "Bearer "+x.token)
		}
		if x.key != "" {
			r.Header.Set("Idempotency-Key", x.key)
		}
		return r
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	resp, err := http.DefaultClient.Do(newReq(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", x.method, x.path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read the answer: %v", x.method, x.path, err)
	}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	req := newReq(ctx)
	route, params, err := router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s %s is not in the document: %v", x.method, x.path, err)
	}
	reqIn := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}}
	if err := openapi3filter.ValidateRequest(ctx, reqIn); (err == nil) != validRequest {
		t.Errorf("%s %s (key %q, body %s): request validation error %v, want an error: %v", x.method, x.path, x.key, x.body, err, !validRequest)
	}
	in := &openapi3filter.ResponseValidationInput{RequestValidationInput: reqIn, Status: resp.StatusCode, Header: resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
	in.SetBodyBytes(raw)
	if err := openapi3filter.ValidateResponse(ctx, in); err != nil {
		t.Errorf("%s %s (key %q, body %s) answered %d %v %s, which the document does not declare: %v",
			x.method, x.path, x.key, x.body, resp.StatusCode, resp.Header, raw, err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, raw: raw}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

// TestExampleServerAnswersMatchDocument starts the example server, loads
// the document it serves at GET /openapi.json, and validates real answers
// of its routes against it: requests and responses, the idempotency
// middleware's answers included.
func TestExampleServerAnswersMatchDocument(t *testing.T) {
	base := exampleServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/openapi.json", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	served, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /openapi.json: %d %v", resp.StatusCode, err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(served)
	if err != nil {
		t.Fatalf("load the served document: %v", err)
	}
	if err := doc.Validate(ctx); err != nil {
		t.Fatalf("the served document is not valid: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: base}} // the port this run listens on

	want := func(a answer, status int, code string) {
		t.Helper()
		if a.status != status || (code != "" && a.body["error"] != code) {
			t.Errorf("answered %d %s, want %d %q", a.status, a.raw, status, code)
		}
	}
	user := send(t, doc, base, exchange{method: "POST", path: "/api/demo/users", body: `{"name":"ada"}`}, true)
	want(user, 201, "")
	tok, _ := user.body["token"].(string)

	key, order := uuid.NewString(), `{"symbol":"AAPL","side":"buy","qty":1}`
	placed := send(t, doc, base, exchange{method: "POST", path: "/api/trading/orders", token: tok, key: key, body: order}, true)
	want(placed, 201, "")
	replay := send(t, doc, base, exchange{method: "POST", path: "/api/trading/orders", token: tok, key: key, body: order}, true)
	want(replay, 201, "")
	if replay.header.Get("Idempotent-Replayed") != "true" || replay.body["id"] != placed.body["id"] {
		t.Errorf("the retry is not a replay of %s: %v %s", placed.raw, replay.header, replay.raw)
	}
	want(send(t, doc, base, exchange{method: "POST", path: "/api/trading/orders", token: tok, key: key,
		body: `{"symbol":"AAPL","side":"buy","qty":2}`}, true), 422, "idempotency_key_body_mismatch")

	failed, xfail := uuid.NewString(), `{"symbol":"XFAIL","side":"buy","qty":1}`
	want(send(t, doc, base, exchange{method: "POST", path: "/api/trading/orders", token: tok, key: failed, body: xfail}, true), 500, "fill_engine_error")
	want(send(t, doc, base, exchange{method: "POST", path: "/api/trading/orders", token: tok, key: failed, body: xfail}, true), 409, "idempotency_previous_failed")

	// Requests the document refuses, answered as it declares.
	want(send(t, doc, base, exchange{method: "POST", path: "/api/trading/orders", token: tok, key: "not-a-uuid", body: order}, false),
		400, "Idempotency-Key must be a UUID string")
	want(send(t, doc, base, exchange{method: "POST", path: "/api/trading/orders", token: tok, key: uuid.NewString(),
		body: `{"symbol":"AAPL","side":"hold","qty":1}`}, false), 400, "invalid_order")
	want(send(t, doc, base, exchange{method: "POST", path: "/api/trading/orders", key: uuid.NewString(), body: order}, true), 401, "unauthorized")

	sessionKey, plan := uuid.NewString(), `{"plan":"pro"}`
	want(send(t, doc, base, exchange{method: "POST", path: "/api/billing/checkout-sessions", token: tok, key: sessionKey, body: plan}, true), 201, "")
	again := send(t, doc, base, exchange{method: "POST", path: "/api/billing/checkout-sessions", token: tok, key: sessionKey, body: plan}, true)
	want(again, 201, "")
	if again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the checkout session's retry is not a replay: %v", again.header)
	}

	id, _ := placed.body["id"].(float64)
	orderPath := "/api/trading/orders/" + json.Number(jsonInt(id)).String()
	want(send(t, doc, base, exchange{method: "GET", path: "/api/trading/orders", token: tok}, true), 200, "")
	want(send(t, doc, base, exchange{method: "GET", path: orderPath, token: tok}, true), 200, "")
	want(send(t, doc, base, exchange{method: "DELETE", path: orderPath, token: tok}, true), 409, "order_not_cancellable")
	want(send(t, doc, base, exchange{method: "GET", path: "/api/billing/checkout-sessions", token: tok}, true), 200, "")
	want(send(t, doc, base, exchange{method: "GET", path: "/healthz"}, true), 200, "")
	want(send(t, doc, base, exchange{method: "GET", path: "/metrics"}, true), 200, "")
}

// jsonInt writes an integral float64 as JSON integer text.
func jsonInt(f float64) string { b, _ := json.Marshal(int64(f)); return string(b) }
