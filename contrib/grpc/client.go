package idemgrpc

// The client interceptor: one key per logical call, kept across its
// retries; only the answers that invite a retry with the same key are
// retried.

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ClientConfig tunes UnaryClientInterceptor.
type ClientConfig struct {
	// Methods are the full method names that get a key; nil means every
	// unary method.
	Methods []string
	// MaxAttempts bounds the attempts of one logical call. Defaults to 5.
	MaxAttempts int
	// Backoff is the first retry's delay without a RetryInfo, doubled
	// (with jitter) for each further one, up to 2s. Defaults to 50ms.
	Backoff time.Duration
}

// keyCtx carries a caller's key (WithKey).
type keyCtx struct{}

// WithKey returns ctx carrying key as the idempotency key of the calls
// made with it, for a caller that keeps its own key (a payment's id)
// across process restarts.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// UnaryClientInterceptor returns the interceptor that sends one key with
// every attempt of a logical call (WithKey's, the outgoing metadata's, or
// a new random UUID) and retries it, under the caller's deadline, while
// the answer is Unavailable or Aborted IDEMPOTENCY_IN_FLIGHT, waiting as
// long as a RetryInfo asks. Every other answer is returned at once.
func UnaryClientInterceptor(cfg ClientConfig) grpc.UnaryClientInterceptor {
	cfg.MaxAttempts = max(cfg.MaxAttempts, 0)
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 50 * time.Millisecond
	}
	var only map[string]bool
	if cfg.Methods != nil {
		only = make(map[string]bool, len(cfg.Methods))
		for _, m := range cfg.Methods {
			only[m] = true
		}
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if only != nil && !only[method] {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		ctx = withOutgoingKey(ctx)
		backoff := cfg.Backoff
		for attempt := 1; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, opts...)
			delay, retry := retryDelay(err)
			if !retry || attempt >= cfg.MaxAttempts {
				return err
			}
			if delay == 0 {
				delay = backoff/2 + rand.N(backoff/2+1)
				backoff = min(2*backoff, 2*time.Second)
			}
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
	}
}

// withOutgoingKey returns ctx with one key in its outgoing metadata.
func withOutgoingKey(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	if len(md.Get(MetadataKey)) > 0 {
		return ctx
	}
	key, _ := ctx.Value(keyCtx{}).(string)
	if key == "" {
		key = uuid.NewString()
	}
	return metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
}

// retryDelay reports whether err invites a retry with the same key, and
// the delay its RetryInfo asks for (0: none given).
func retryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return 0, false
	}
	var delay time.Duration
	inFlight := false
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			delay = d.GetRetryDelay().AsDuration()
		case *errdetails.ErrorInfo:
			inFlight = d.GetDomain() == Domain && d.GetReason() == "IDEMPOTENCY_IN_FLIGHT"
		}
	}
	switch st.Code() {
	case codes.Unavailable:
		return delay, true
	case codes.Aborted:
		return delay, inFlight
	}
	return 0, false
}
