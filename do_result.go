package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// How Do's outcomes become the Response the engine records, and back: a
// value is a 200 whose body is its encoding; a *PermanentError a 422 whose
// JSON body holds its code and message; a Retryable error a 429 (the key
// is released); an error wrapping ErrUnsettled ends as Unsettled (nothing
// recorded, the lease ended); any other error a 500 (the key fails).

// Do runs fn at most once per (c.Key, scope, op), detached from ctx's
// cancellation with the lease less the store timeout, and records its
// outcome for every other call (info.Replayed). nil completes (the value
// decoded from its stored encoding, first run too); so does a
// *PermanentError; a Retryable error releases the key; any other error or
// a panic (re-raised) fails it. A call that does not run fn gets an
// *ErrorAnswer. On a Transactional op, fn writes through TxFromContext(ctx).
func Do[T any](ctx context.Context, op *Operation, c Call, fn func(context.Context) (T, error)) (T, CallInfo, error) {
	var (
		ran   bool  // fn ran in this call
		value T     // its value, decoded from its encoding
		fnErr error // its error, when it is returned as is
	)
	resp, info, err := op.Exec(ctx, c, func(ctx context.Context) Response {
		ran = true
		v, err := fn(ctx)
		var resp Response
		resp, value, fnErr = encodeResult(op, v, err)
		return resp
	})
	var zero T
	var ea *ErrorAnswer
	switch {
	case err != nil && ran && errors.Is(fnErr, ErrUnsettled) && errors.As(err, &ea):
		ea.err = errors.Join(ErrStoreUnavailable, fnErr) // unwraps to the function's error
		return zero, info, err
	case err != nil:
		return zero, info, err
	case ran && fnErr != nil:
		return zero, info, fnErr
	case resp.Status == statusPermanent:
		return zero, info, decodePermanent(resp)
	case ran:
		return value, info, nil
	}
	v, err := decodeValue[T](op, resp)
	return v, info, err
}

// statusPermanent is the status a *PermanentError is recorded with.
const statusPermanent = 422

// permanentJSON is a *PermanentError as it is stored.
type permanentJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// encodeResult turns fn's outcome into the Response to record, the value
// decoded back from its encoding, and the error Do returns as it is
// (Retryable, any other error, or a value that does not encode and decode).
func encodeResult[T any](op *Operation, v T, err error) (Response, T, error) {
	var zero T
	var pe *PermanentError
	switch {
	case errors.Is(err, ErrUnsettled):
		return Response{Status: 503, Header: http.Header{outcomeHeader: {outcomeUnsettled}}}, zero, err
	case errors.As(err, new(*RetryableError)):
		return Response{Status: statusTooManyRequests}, zero, err
	case errors.As(err, &pe):
		body, _ := json.Marshal(permanentJSON{pe.Code, pe.Message}) // two strings always encode
		return Response{Status: statusPermanent, Body: body, BodyKind: BodyJSON}, zero, nil
	case err != nil:
		return Response{Status: 500}, zero, err
	}
	codec, kind := op.codecOf()
	body, err := codec.Marshal(v)
	var back T
	if err == nil {
		err = codec.Unmarshal(body, &back)
	}
	if err != nil {
		return Response{Status: 500}, zero, fmt.Errorf("idempotency: %s: the result does not encode and decode: %w", op.endpoint, err)
	}
	return Response{Status: 200, Body: body, BodyKind: kind}, back, nil
}

// decodeValue decodes a replayed value.
func decodeValue[T any](op *Operation, resp Response) (T, error) {
	var v T
	codec, _ := op.codecOf()
	if resp.Status != 200 {
		return v, fmt.Errorf("idempotency: %s: the stored result has status %d, which Do does not record", op.endpoint, resp.Status)
	}
	if err := codec.Unmarshal(resp.Body, &v); err != nil {
		return v, fmt.Errorf("idempotency: %s: the stored result does not decode: %w", op.endpoint, err)
	}
	return v, nil
}

// decodePermanent returns a recorded *PermanentError.
func decodePermanent(resp Response) error {
	var p permanentJSON
	if err := json.Unmarshal(resp.Body, &p); err != nil {
		return fmt.Errorf("idempotency: the stored permanent error does not decode: %w", err)
	}
	return &PermanentError{Code: p.Code, Message: p.Message}
}

// codecOf is the Operation's codec and the body kind its encodings are
// stored as: JSON for the default, raw bytes for any other.
func (op *Operation) codecOf() (Codec, BodyKind) {
	if op.codec == nil {
		return jsonCodec{}, BodyJSON
	}
	return op.codec, BodyRaw
}

// jsonCodec is the default Codec: encoding/json.
type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
