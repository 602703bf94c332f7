package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/examples/consumer/payment"
)

// ledgerDDL is the ledger, in the same database (and schema) as the
// idempotency table, so one transaction holds the key's claim, the entry
// and the key's record. payment_id is deliberately not UNIQUE: the tests
// count a double execution instead of having a constraint hide it. A real
// ledger adds UNIQUE (payment_id) as a second fence.
const ledgerDDL = `
CREATE TABLE IF NOT EXISTS ledger (
	id           BIGSERIAL PRIMARY KEY,
	payment_id   TEXT        NOT NULL,
	user_id      TEXT        NOT NULL,
	amount_cents BIGINT      NOT NULL,
	currency     TEXT        NOT NULL,
	outcome      TEXT        NOT NULL CHECK (outcome IN ('settled', 'declined')),
	reason       TEXT,
	booked_at    TIMESTAMPTZ NOT NULL DEFAULT now()
)`

// createLedger creates the ledger table unless it exists, under an advisory
// lock: two consumers starting at once would otherwise race on the catalog
// (CREATE TABLE IF NOT EXISTS is not safe against itself).
func createLedger(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('examples/consumer ledger'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, ledgerDDL)
		return err
	})
}

// receipt is what settling a payment returns, and what a redelivery of the
// same message gets back from the key's record.
type receipt struct {
	LedgerID int64 `json:"ledger_id"`
}

// currencies are the ones this ledger books.
var currencies = map[string]bool{"EUR": true, "USD": true, "GBP": true}

// decline is the business rule: a payment this ledger will not book. The
// decline is booked too (outcome declined) and replays as the same
// *PermanentError.
func decline(p payment.Payment) *idempotency.PermanentError {
	switch {
	case p.AmountCents <= 0:
		return &idempotency.PermanentError{Code: "invalid_amount", Message: "the amount must be positive"}
	case !currencies[p.Currency]:
		return &idempotency.PermanentError{Code: "unsupported_currency", Message: "this ledger books EUR, USD and GBP"}
	}
	return nil
}

// book writes p's ledger entry through the transaction Do lends the
// function, so the entry commits with the key's record or not at all.
func book(ctx context.Context, p payment.Payment, rejected *idempotency.PermanentError) (int64, error) {
	tx, ok := idempotency.TxFromContext(ctx)
	if !ok {
		return 0, errors.New("no transaction in the function's context: the operation must be transactional")
	}
	outcome, reason := "settled", (*string)(nil)
	if rejected != nil {
		outcome, reason = "declined", &rejected.Code
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO ledger (payment_id, user_id, amount_cents, currency, outcome, reason)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`,
		p.ID, p.UserID, p.AmountCents, p.Currency, outcome, reason).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("ledger: %w", err)
	}
	return id, nil
}

// transient reports whether a failed ledger write may succeed when tried
// again (the function then returns it Retryable: the key is released and
// the redelivery books again): a lost connection, a deadline, a
// serialization failure or an overloaded server pass; a constraint or a
// type error that the database refused the row for does not.
func transient(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return true
	}
	switch pe.Code[:2] {
	case "08", "40", "53", "57", "58": // connection, rollback, resources, operator, system
		return true
	}
	return false
}
