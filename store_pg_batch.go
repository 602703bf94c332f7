package idempotency

import (
	"context"
	"time"

	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5"
)

// Group commit on PostgreSQL (batch.go has the queues): a round's
// statements and commit, and its two kinds of call, claims
// (pgsql.ClaimBatchSQL) and records (pgsql.CompleteBatchSQL).

// answersBatch reports a round failure that every call of it shares (an
// outage, saturation, configuration): each is answered with it at once.
// The others (a lock wait, a deadlock, a refused value) retry each call
// alone, once.
func answersBatch(err error) bool {
	switch pgReason(err) {
	case ReasonLockTimeout, ReasonConflict, ReasonData, ReasonOther:
		return false
	}
	return true
}

// roundLockWait is a round's lock_timeout (pgsql.RoundSettingsSQL): the
// transactional wait bound.
var roundLockWait = pgInterval(DefaultTxLockWait)

// runRound claims and records the calls of one round. A second call for a
// row waits for the first's answer, then goes alone: a duplicate claim
// reads the first's row and loses. A round of one call goes alone, as it
// would without batching; a round that failed for a reason of its own
// (answersBatch) sends every call alone. A call its caller withdrew is
// never sent.
func (s *PostgresStore) runRound(claims []*claimCall, records []*recordCall) {
	cb, cdups := firsts(claims, sameClaim)
	rb, rdups := firsts(records, func(a, b *recordCall) bool { return a.f.ID == b.f.ID })
	var (
		got      []ClaimResult
		recorded []bool
		err      error
		sent     = len(cb)+len(rb) > 1
	)
	if sent {
		got, recorded, err = s.roundRows(cb, rb)
		if err != nil && answersBatch(err) {
			cerr, rerr := pgStoreError("claim", err), pgStoreError("complete", err)
			for _, c := range claims {
				c.answer(ClaimResult{}, cerr)
			}
			for _, c := range records {
				c.answer(rerr)
			}
			return
		}
	}
	s.answerClaims(cb, cdups, got)
	var alone []*recordCall
	for _, d := range rdups {
		alone = append(alone, d...)
	}
	switch {
	case !sent || err != nil:
		alone = records
	default:
		for i, c := range rb {
			switch {
			case recorded[i]:
				c.answer(nil)
			case c.state.Load() == callSent:
				c.answer(ErrNotOwner)
			}
		}
	}
	for _, c := range alone {
		if c.send() {
			go func() { c.answer(s.completeAlone(c.ctx, &c.record)) }()
		}
	}
}

// round is one round's first calls of each row and, once it committed,
// what it read: got[i] is claims[i]'s row (a zero Record.ID where the claim
// statement returned none or the claim was not sent), recorded[i] whether
// records[i]'s row was recorded.
type round struct {
	claims   []*claimCall
	records  []*recordCall
	got      []ClaimResult
	recorded []bool
}

// roundRows runs one round's statements, the round's settings first, in
// one transaction, for the calls still pending when a connection is in
// hand. The transaction is the one pgx runs a batch in (an explicit BEGIN
// and COMMIT would be two more statements each round): the extended
// protocol's modes send the batch as one pipeline ended by one Sync, and
// PostgreSQL commits at the Sync; the simple protocol sends it as one
// query string, committed after its last statement. An error of the
// commit reaches the last result read or Close, and fails the round
// (TestGroupCommitRoundCommitFails, in each mode). A round that fails
// leaves no transaction open: it ends at the Sync, rolled back, or with
// the connection.
func (s *PostgresStore) roundRows(claims []*claimCall, records []*recordCall) (got []ClaimResult, recorded []bool, err error) {
	var d roundDeadline
	addDeadlines(&d, claims)
	addDeadlines(&d, records)
	ctx, cancel := d.context()
	defer cancel()
	r := round{claims, records, make([]ClaimResult, len(claims)), make([]bool, len(records))}
	err = s.withConn(ctx, func(c pgConn) error {
		ca, ra := claimBatchArgs(claims), recordBatchArgs(records)
		if ca == nil && ra == nil {
			return nil
		}
		b := &pgx.Batch{}
		b.Queue(pgsql.RoundSettingsSQL, roundLockWait)
		if ca != nil {
			b.Queue(pgsql.ClaimBatchSQL, ca...)
		}
		if ra != nil {
			b.Queue(pgsql.CompleteBatchSQL, ra...)
		}
		br := c.SendBatch(ctx, b)
		err := r.read(br, ca != nil, ra != nil)
		if cerr := br.Close(); err == nil {
			err = cerr // the commit's, or the connection's
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return r.got, r.recorded, nil
}

// read reads roundRows' results: the settings, the claims' rows (if
// sent), the records' ids (if sent).
func (r *round) read(br pgx.BatchResults, sentClaims, sentRecords bool) error {
	if _, err := br.Exec(); err != nil {
		return err
	}
	if sentClaims {
		var sc claimScanner
		err := readRows(br, func(rows pgx.Rows) error {
			var res ClaimResult
			if err := sc.scan(rows, &res.Record, &res.Won); err != nil {
				return err
			}
			for i, c := range r.claims {
				if c.names(res.Record.Key, res.Record.Scope, res.Record.Endpoint) {
					r.got[i] = res
					break
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if sentRecords {
		err := readRows(br, func(rows pgx.Rows) error {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return err
			}
			for i, c := range r.records {
				if c.f.ID == id {
					r.recorded[i] = true
					break
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// readRows reads the next result's rows with each.
func readRows(br pgx.BatchResults, each func(pgx.Rows) error) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	for rows.Next() {
		if err := each(rows); err != nil {
			rows.Close()
			return err
		}
	}
	rows.Close()
	return rows.Err()
}

// claimCall is one queued claim and, once done is closed, its answer.
type claimCall struct {
	batchCall
	req ClaimRequest
	res ClaimResult
	err error
}

func (c *claimCall) call() *batchCall { return &c.batchCall }

func (c *claimCall) answer(res ClaimResult, err error) {
	c.res, c.err = res, err
	close(c.done)
}

// names reports whether a claim names the row of key, scope and endpoint.
func (c *claimCall) names(key, scope, endpoint string) bool {
	return c.req.Key == key && c.req.Scope == scope && c.req.Endpoint == endpoint
}

// sameClaim reports whether two claims name one row.
func sameClaim(a, b *claimCall) bool { return a.names(b.req.Key, b.req.Scope, b.req.Endpoint) }

// Claim implements Store in one round trip, alone or in a round.
func (s *PostgresStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	b := s.batch.Load()
	if b == nil || !batchable(req.Key, req.Scope, req.Endpoint, req.DeriveKeyID) {
		return s.claimAlone(ctx, req)
	}
	g := &b.gate
	if !g.take(b.slots) {
		c := &claimCall{req: req}
		c.ctx, c.done = ctx, make(chan struct{})
		if !enter(g, &g.claims, c, b.slots) {
			return s.claimQueued(ctx, g, c)
		}
	}
	res, err := s.claimAlone(ctx, req)
	g.handOn(b.max, s.runRound)
	return res, err
}

// claimQueued waits for a queued claim's round, or claims alone when
// waitBatched says so.
func (s *PostgresStore) claimQueued(ctx context.Context, g *roundGate, c *claimCall) (ClaimResult, error) {
	switch alone, err := waitBatched(ctx, c, func() { leave(g, &g.claims, c) }); {
	case alone:
		return s.claimAlone(ctx, c.req)
	case err != nil:
		return ClaimResult{}, pgStoreError("claim", err)
	}
	return c.res, c.err
}

// answerClaims answers a round's claims: each first call of a row that
// the round read (got[i], nil when the round was not sent or failed), and
// alone the others: a first call without a row (its conflicting row
// committed after the statement's snapshot, or the round failed), then
// the later calls for its row (dups[i]).
func (s *PostgresStore) answerClaims(batch []*claimCall, dups [][]*claimCall, got []ClaimResult) {
	for i, c := range batch {
		var rest []*claimCall
		if dups != nil {
			rest = dups[i]
		}
		ok := got != nil && got[i].Record.ID != 0
		if ok && len(rest) == 0 { // the common case: answered by the round
			c.answer(got[i], nil)
			continue
		}
		go func() {
			if ok {
				c.answer(got[i], nil)
			} else if c.send() {
				c.answer(s.claimAlone(c.ctx, c.req))
			}
			for _, d := range rest {
				if d.send() {
					d.answer(s.claimAlone(d.ctx, d.req))
				}
			}
		}()
	}
}

// claimBatchArgs are pgsql.ClaimBatchSQL's arrays for the calls it marks
// sent, in order: nil when every one was withdrawn.
func claimBatchArgs(calls []*claimCall) []any {
	n := len(calls)
	keys, scopes, endpoints, hashes, derive := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	ttls, leases, graces := make([]time.Duration, 0, n), make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	owners := make([]*string, 0, n)
	for _, c := range calls {
		if !c.send() {
			continue
		}
		r := c.req
		keys, scopes, endpoints = append(keys, r.Key), append(scopes, r.Scope), append(endpoints, r.Endpoint)
		hashes, derive = append(hashes, r.RequestHash), append(derive, r.DeriveKeyID)
		ttls, leases, graces = append(ttls, r.TTL), append(leases, r.Lease), append(graces, r.Grace)
		var owner *string
		if o, ok := ownerArg(r.Owner).(string); ok {
			owner = &o
		}
		owners = append(owners, owner)
	}
	if len(keys) == 0 {
		return nil
	}
	return []any{keys, scopes, endpoints, hashes, ttls, leases, owners, derive, graces}
}

// record is what a record writes to its row.
type record struct {
	f    Fence
	code int    // response_code
	body []byte // response_body
	raw  []byte // response_body_raw
	hdrs []byte // response_headers
	seal *string
}

// recordCall is one queued record and, once done is closed, its answer.
type recordCall struct {
	batchCall
	record
	err error
}

func (c *recordCall) call() *batchCall { return &c.batchCall }

func (c *recordCall) answer(err error) {
	c.err = err
	close(c.done)
}

// complete writes r to its row, alone or in a round (a record that wakes
// waiters goes alone: pgsql.WakeSQL follows it); a lone record allocates
// nothing to be batched.
func (s *PostgresStore) complete(ctx context.Context, r *record) error {
	b := s.batch.Load()
	if b == nil || r.f.wake || !batchable(r.f.Key, r.f.Scope, r.f.Endpoint) {
		return s.completeAlone(ctx, r)
	}
	g := &b.gate
	if !g.take(b.slots) {
		c := &recordCall{record: *r}
		c.ctx, c.done = ctx, make(chan struct{})
		if !enter(g, &g.records, c, b.slots) {
			return s.completeQueued(ctx, g, c)
		}
	}
	err := s.completeAlone(ctx, r)
	g.handOn(b.max, s.runRound)
	return err
}

// completeQueued waits for a queued record's round, or records alone when
// waitBatched says so (claimQueued's twin).
func (s *PostgresStore) completeQueued(ctx context.Context, g *roundGate, c *recordCall) error {
	switch alone, err := waitBatched(ctx, c, func() { leave(g, &g.records, c) }); {
	case alone:
		return s.completeAlone(ctx, &c.record)
	case err != nil:
		return pgStoreError("complete", err)
	}
	return c.err
}

// completeAlone runs pgsql.CompleteSQL for c.
func (s *PostgresStore) completeAlone(ctx context.Context, c *record) error {
	conn, err := s.conn(ctx)
	if err != nil {
		return pgStoreError("complete", err)
	}
	defer conn.release()
	f := c.f
	var seal any
	if c.seal != nil {
		seal = *c.seal
	}
	args := []any{f.ID, f.Attempt, f.Scope, c.code, c.body, c.raw, c.hdrs, seal, f.Key, f.Endpoint}
	if err := execFenced(ctx, conn, pgsql.CompleteSQL, args); err != nil {
		return pgOwnerError("complete", err)
	}
	s.wake(ctx, conn, f)
	return nil
}

// recordBatchArgs are pgsql.CompleteBatchSQL's arrays for the calls it
// marks sent, in order: nil when every one was withdrawn.
func recordBatchArgs(calls []*recordCall) []any {
	n := len(calls)
	ids, attempts := make([]int64, 0, n), make([]int32, 0, n)
	scopes, keys, endpoints := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	codes, bodies, raws, hdrs, seals := make([]int16, 0, n), make([][]byte, 0, n), make([][]byte, 0, n), make([][]byte, 0, n), make([]*string, 0, n)
	for _, c := range calls {
		if !c.send() {
			continue
		}
		ids, attempts = append(ids, c.f.ID), append(attempts, c.f.Attempt)
		scopes, keys, endpoints = append(scopes, c.f.Scope), append(keys, c.f.Key), append(endpoints, c.f.Endpoint)
		codes, bodies, raws = append(codes, int16(c.code)), append(bodies, c.body), append(raws, c.raw)
		hdrs, seals = append(hdrs, c.hdrs), append(seals, c.seal)
	}
	if len(ids) == 0 {
		return nil
	}
	return []any{ids, attempts, scopes, keys, endpoints, codes, bodies, raws, hdrs, seals}
}
