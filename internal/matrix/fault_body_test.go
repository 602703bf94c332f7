//go:build matrix

package matrix

import (
	"bytes"
	"context"
	"strings"
)

// Bodies the engine accepts, every store records ("Every body the engine
// accepts, the store records"): JSON 40 levels deep, and JSON with a lone
// surrogate escape and a byte that is not UTF-8. The call answers 201, the
// retry replays the bytes recorded (on HTTP, with the marker member the
// contract inserts into an object), and the key ran once.

func bodyFaults() []*fault {
	deep := []byte(strings.Repeat("[", 40) + `{"ok":true}` + strings.Repeat("]", 40))
	odd := []byte("{\"s\":\"\\ud800\",\"b\":\"\xff\xfe\"}")
	return []*fault{
		bodyFault("deep JSON (40 levels)", deep),
		bodyFault("lone surrogate, bad UTF-8", odd),
	}
}

func bodyFault(name string, body []byte) *fault {
	h := func(ctx context.Context, hc *hctx) (int, []byte) {
		if err := hc.effect(ctx); err != nil {
			return failure(err)
		}
		return 201, body
	}
	return simple(name, nil, envOpts{h: h}, func(e *env) {
		key := newKey()
		first := e.retryBusy(key) // a loaded MariaDB may answer 503 first: the body is the point here
		e.expect("first call", first, "")
		e.within("first call", first, 0)
		again := e.send(key)
		e.expect("retry", again, "")
		if again.handler && !again.replayed {
			e.failf("retry: ran again (want a replay): %v", again)
		}
		got := bytes.Replace(again.body, []byte(`"idempotency_replayed":true,`), nil, 1)
		if e.c.entry != entryDo && again.handler && !bytes.Equal(got, body) {
			e.failf("retry: replayed %q, recorded %q", again.body, body)
		}
		e.atMostOnce(key, 1)
		e.noBypass()
	})
}
