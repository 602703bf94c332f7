package idempotency

// A sealing store is one of two types: a Store, or a TxStore when its
// inner store is one (the only capability outside Store).

// variant returns w as a TxStore when its inner store is one, else as a
// plain Store: the capabilities of the wrapper are exactly its inner
// store's.
func (w *sealingStore) variant() Store {
	if _, ok := w.inner.(TxStore); ok {
		return sealingTxStore{w}
	}
	return w
}
