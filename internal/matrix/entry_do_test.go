//go:build matrix

package matrix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idempotency"
)

// handlerError is a behaviour's failure as Do's function returns it.
type handlerError struct {
	status int
	body   []byte
}

func (h *handlerError) Error() string { return fmt.Sprintf("handler %d: %s", h.status, h.body) }

// serveDo runs h as the function of an Operation's Do calls, in this
// process (the kill -9 cells run Do in a child process instead).
func serveDo(e *env, rc idempotency.RouteConfig, h behaviour) (caller, error) {
	op, err := e.mw.Operation("orders", rc)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, key string, body []byte) answer {
		v, info, err := idempotency.Do(ctx, op, idempotency.Call{Key: key, Request: body},
			func(ctx context.Context) (json.RawMessage, error) {
				status, out := h(ctx, &hctx{key: key, body: body})
				if status == statusUnsettled {
					return nil, fmt.Errorf("handler: %w", idempotency.ErrUnsettled)
				}
				if status >= 300 {
					return nil, &handlerError{status, out}
				}
				return out, nil
			})
		return doAnswer(v, info, err)
	}, nil
}

// doAnswer reads Do's result: an *ErrorAnswer is the contract's answer,
// any other error the function's.
func doAnswer(v json.RawMessage, info idempotency.CallInfo, err error) answer {
	var ea *idempotency.ErrorAnswer
	var he *handlerError
	switch {
	case errors.As(err, &ea):
		return answer{code: problemCode(ea.Type, ea.Code), expires: ea.Expires}
	case errors.As(err, &he):
		return answer{handler: true, status: he.status, body: he.body, expires: info.Expires}
	case err != nil:
		return answer{handler: true, status: 500, body: []byte(err.Error()), expires: info.Expires}
	}
	return answer{handler: true, status: 201, body: v, replayed: info.Replayed, bypassed: info.Bypassed, expires: info.Expires}
}

// problemCode is the idempotency_... code at the end of a problem type URI
// (the key sentences' codes too), else code.
func problemCode(typ, code string) string {
	if i := strings.LastIndex(typ, "idempotency_"); i >= 0 {
		return typ[i:]
	}
	return code
}
