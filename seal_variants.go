package idempotency

import "context"

// The middleware finds what a store can do by type assertion (TxStore for
// transactional routes, OwnerReleaser to free a claim whose reply was
// lost, KeyReleaser for the CLI's release, Check at start-up). A wrapper
// that lacked one would switch its feature off without a word, and one
// that claimed one its inner store lacks would fail at run time: so a
// sealing store is one of sixteen types, each with exactly the optional
// interfaces of its inner store.

// One method set per optional interface, each delegating to the sealing
// store.
type (
	sealTxStore       struct{ w *sealingStore }
	sealOwnerReleaser struct{ w *sealingStore }
	sealKeyReleaser   struct{ w *sealingStore }
	sealChecker       struct{ w *sealingStore }
)

func (m sealTxStore) BeginClaim(ctx context.Context, req *ClaimRequest) (RouteTx, ClaimResult, error) {
	return m.w.beginClaim(ctx, req)
}

func (m sealOwnerReleaser) ReleaseOwner(ctx context.Context, req ClaimRequest) (bool, error) {
	return m.w.releaseOwner(ctx, req)
}

func (m sealKeyReleaser) Lookup(ctx context.Context, key, scope, endpoint string) (KeyRows, error) {
	return m.w.lookup(ctx, key, scope, endpoint)
}

func (m sealKeyReleaser) ReleaseKey(ctx context.Context, f Fence) (bool, error) {
	return m.w.releaseKey(ctx, f)
}

func (m sealChecker) Check(ctx context.Context) error { return m.w.check(ctx) }

// withInterfaces returns w as the type whose optional interfaces are
// exactly those of w.inner.
func (w *sealingStore) withInterfaces() Store {
	var mask int
	for i, has := range []bool{is[TxStore](w.inner), is[OwnerReleaser](w.inner), is[KeyReleaser](w.inner), is[checker](w.inner)} {
		if has {
			mask |= 1 << i
		}
	}
	t, o, k, c := sealTxStore{w}, sealOwnerReleaser{w}, sealKeyReleaser{w}, sealChecker{w}
	switch mask {
	case 0b0001:
		return struct {
			*sealingStore
			sealTxStore
		}{w, t}
	case 0b0010:
		return struct {
			*sealingStore
			sealOwnerReleaser
		}{w, o}
	case 0b0011:
		return struct {
			*sealingStore
			sealTxStore
			sealOwnerReleaser
		}{w, t, o}
	case 0b0100:
		return struct {
			*sealingStore
			sealKeyReleaser
		}{w, k}
	case 0b0101:
		return struct {
			*sealingStore
			sealTxStore
			sealKeyReleaser
		}{w, t, k}
	case 0b0110:
		return struct {
			*sealingStore
			sealOwnerReleaser
			sealKeyReleaser
		}{w, o, k}
	case 0b0111:
		return struct {
			*sealingStore
			sealTxStore
			sealOwnerReleaser
			sealKeyReleaser
		}{w, t, o, k}
	case 0b1000:
		return struct {
			*sealingStore
			sealChecker
		}{w, c}
	case 0b1001:
		return struct {
			*sealingStore
			sealTxStore
			sealChecker
		}{w, t, c}
	case 0b1010:
		return struct {
			*sealingStore
			sealOwnerReleaser
			sealChecker
		}{w, o, c}
	case 0b1011:
		return struct {
			*sealingStore
			sealTxStore
			sealOwnerReleaser
			sealChecker
		}{w, t, o, c}
	case 0b1100:
		return struct {
			*sealingStore
			sealKeyReleaser
			sealChecker
		}{w, k, c}
	case 0b1101:
		return struct {
			*sealingStore
			sealTxStore
			sealKeyReleaser
			sealChecker
		}{w, t, k, c}
	case 0b1110:
		return struct {
			*sealingStore
			sealOwnerReleaser
			sealKeyReleaser
			sealChecker
		}{w, o, k, c}
	case 0b1111:
		return struct {
			*sealingStore
			sealTxStore
			sealOwnerReleaser
			sealKeyReleaser
			sealChecker
		}{w, t, o, k, c}
	}
	return w
}

// is reports whether v implements T.
func is[T any](v any) bool {
	_, ok := v.(T)
	return ok
}
