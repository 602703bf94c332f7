package idemconnect_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/idemkit/idempotency"
	idemconnect "github.com/idemkit/idempotency/contrib/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestExpires: over each protocol, the key's expiry, its row's expires_at
// rounded down to the second as RFC 3339 UTC, is the Idempotency-Expires
// header of the handler's answer (a message or an error) and of a replay,
// and the ErrorInfo metadata expires_at of the contract's answers about
// the row; an answer that read no row (a bad key) carries none, and no
// method may store it.
func TestExpires(t *testing.T) {
	t.Parallel()
	store := idempotency.NewMemoryStore()
	mw, err := idempotency.New(store, idempotency.Config{
		Registerer: prometheus.NewRegistry(), Logger: quiet, Enabled: func(context.Context) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	r := &counter{}
	base := serveProcs(t, mw, map[string]idemconnect.Method{svc + "Transfer": {}}, map[string]procFunc{
		svc + "Transfer": func(_ context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
			r.note(req.Header().Get(idemconnect.KeyHeader))
			if err := asked(req); err != nil {
				return nil, err
			}
			out := reply(req, "1")
			out.Header().Set(idemconnect.ExpiresHeader, "the handler's")
			return out, nil
		}})
	expiresOf := func(key string) string {
		recs, err := store.ExportScope(t.Context(), "")
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			if rec.Key == key {
				return rec.ExpiresAt.UTC().Truncate(time.Second).Format("2006-01-02T15:04:05Z")
			}
		}
		t.Fatalf("no row for %s", key)
		return ""
	}
	hc := h2cClient()
	for _, w := range wires {
		ctx := t.Context()
		c := dialProc(hc, base, svc+"Transfer", w)
		key := uuid.NewString()
		for _, what := range []string{"first", "replay"} {
			resp, err := call(ctx, c, key, map[string]any{"a": 1})
			if err != nil {
				t.Fatalf("%s: %s: %v", w.name, what, err)
			}
			if got := resp.Header().Values(idemconnect.ExpiresHeader); len(got) != 1 || got[0] != expiresOf(key) {
				t.Fatalf("%s: %s: %s %v, want [%s]", w.name, what, idemconnect.ExpiresHeader, got, expiresOf(key))
			}
		}
		_, err := call(ctx, c, key, map[string]any{"a": 2})
		wantAnswer(t, w.name+": mismatch", err, connect.CodeInvalidArgument, "IDEMPOTENCY_KEY_BODY_MISMATCH", 0)
		if md := errorInfo(err).GetMetadata(); md["expires_at"] != expiresOf(key) {
			t.Fatalf("%s: mismatch: ErrorInfo metadata %v, want expires_at %s", w.name, md, expiresOf(key))
		}

		failed := uuid.NewString()
		for _, what := range []string{"the handler's error", "its replay"} {
			_, err = call(ctx, c, failed, map[string]any{"code": float64(connect.CodeNotFound)})
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != connect.CodeNotFound || ce.Meta().Get(idemconnect.ExpiresHeader) != expiresOf(failed) {
				t.Fatalf("%s: %s: %v, %s %q, want NotFound with %s", w.name, what, err, idemconnect.ExpiresHeader, ce.Meta().Get(idemconnect.ExpiresHeader), expiresOf(failed))
			}
		}

		_, err = call(ctx, c, "short", map[string]any{"a": 1})
		wantAnswer(t, w.name+": short key", err, connect.CodeInvalidArgument, "IDEMPOTENCY_KEY_INVALID", 0)
		if md := errorInfo(err).GetMetadata(); md["expires_at"] != "" {
			t.Fatalf("%s: a bad key read no row, yet ErrorInfo says %v", w.name, md)
		}
	}
	if _, err := idemconnect.NewInterceptor(mw, map[string]idemconnect.Method{svc + "Other": {ReplayHeaders: []string{"Idempotency-Expires"}}}); err == nil {
		t.Fatal("a method may store Idempotency-Expires, which names the row of each answer")
	}
}
