package idempotency

// Call is one call of an Operation.
type Call struct {
	// Key is the call's idempotency key, such as a message's id or a
	// webhook's event id: 1 to 255 visible ASCII characters or spaces,
	// compared exactly (the opaque-key rules); anything else is
	// ErrInvalidKey.
	Key string
	// Scope is the user the call is about ("" asks Config.Scope): keys of
	// different scopes never meet, and erasure finds a user's rows by it.
	Scope string
	// Request is the call's request, hashed as an HTTP body is (JSON
	// canonicalised): the key sent again with other bytes is ErrMismatch.
	Request []byte
}

// CallInfo tells how Do answered a call.
type CallInfo struct {
	Replayed bool // the first run's result, replayed: the function did not run
	Bypassed bool // the function ran without deduplication (kill-switch, or a fail-open store outage)
}

// Codec encodes the results of Do for the store (RouteConfig.Codec):
// Unmarshal must restore what Marshal wrote into the value v points to.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}
