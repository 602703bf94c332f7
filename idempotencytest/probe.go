package idempotencytest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency"
)

// runProbe checks the outage probe (Store.Probe) of a store whose
// database is up: it answers nil, alone and to concurrent callers (who
// share one probe's verdict), within its deadline; whatever it returns
// otherwise is a *StoreError. A fail-open route bypasses only on a probe
// that returned ReasonConnection, so a healthy store's probe must never.
func runProbe(t *testing.T, setup setupFunc) {
	t.Run("Probe", func(t *testing.T) {
		s, ctx := setup(t)
		const bound = 5 * time.Second
		ctx, cancel := context.WithTimeout(ctx, bound)
		defer cancel()
		if err := s.Probe(ctx); err != nil {
			t.Fatalf("Probe of a healthy store: %v, want nil", err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range cap(errs) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- s.Probe(ctx)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("a concurrent Probe of a healthy store: %v, want nil", err)
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("Probe: the probes took longer than %v", bound)
		}
		done, stop := context.WithCancel(context.Background())
		stop()
		if err := s.Probe(done); err != nil {
			if reason := StoreReason(t, "Probe", err); reason == idempotency.ReasonConnection {
				t.Errorf("Probe with its context already cancelled: %v; a healthy database must never read as unreachable "+
					"while a verdict from the last second stands", err)
			}
		}
	})
}
