package idempotency

import "context"

// Derived keys: the identity a handler's call derives the ids it sends
// downstream from (package downstream), carried in the handler's context.

// DeriveKeys gives keys by id, as SealKeys does: a claim stores the
// active id, and the row's derivations use that id's key.
type DeriveKeys interface {
	// ActiveDeriveKey returns the key a new claim stores the id of.
	ActiveDeriveKey(ctx context.Context) (id string, key []byte, err error)
	// DeriveKey returns the key of id, active or derive-only; an error
	// when the keyring no longer holds it.
	DeriveKey(ctx context.Context, id string) (key []byte, err error)
}

// Derivation is the identity package downstream derives a call's ids from.
type Derivation struct {
	// KeyID is the row's derive key id (the active one where no row was
	// written: a fail-open bypass); Scope, Endpoint and Key are the call's
	// user scope, endpoint and idempotency key.
	KeyID, Scope, Endpoint, Key string
	Keys                        DeriveKeys // Config.DeriveKeys, which KeyID is looked up in
}

// DerivationFromContext returns a handler's Derivation; false without a key.
func DerivationFromContext(ctx context.Context) (Derivation, bool) {
	d, ok := ctx.Value(deriveCtxKey).(*Derivation)
	if !ok {
		return Derivation{}, false
	}
	return *d, true
}

// withDerivation returns ctx carrying rec's identity (DerivationFromContext)
// derived under keys: rec is the row a call owns (its DeriveKeyID the one
// its first claim stored), or, for a bypass that wrote no row, the call's
// own claim.
func withDerivation(ctx context.Context, keys DeriveKeys, rec Record) context.Context {
	return context.WithValue(ctx, deriveCtxKey, &Derivation{
		KeyID: rec.DeriveKeyID, Scope: rec.Scope, Endpoint: rec.Endpoint, Key: rec.Key, Keys: keys,
	})
}

// activeDeriveKeyID returns the id of keys' active key, bounded by the
// store timeout; "" without keys, and when they fail (logged: the call's
// derivations then fail as a retired key's do).
func (rq *request) activeDeriveKeyID() string {
	keys := rq.m.cfg.DeriveKeys
	if keys == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(rq.ctx, rq.m.cfg.StoreTimeout)
	defer cancel()
	id, _, err := keys.ActiveDeriveKey(ctx)
	if err != nil {
		rq.m.log.WarnContext(rq.ctx, "idempotency: Config.DeriveKeys gave no active key: this call's derived keys are refused",
			"endpoint", rq.label, "error", err)
		return ""
	}
	return id
}
