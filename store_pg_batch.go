package idempotency

import (
	"context"
	"time"

	"github.com/idemkit/idempotency/internal/pgsql"
	"github.com/jackc/pgx/v5"
)

// Group commit on PostgreSQL (batch.go has the queues): a batch's
// statement and commit, and its two kinds of call, claims
// (pgsql.ClaimBatchSQL) and records (pgsql.CompleteBatchSQL).

// answersBatch reports a batch failure that every call of it shares (an
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

// batchLockSQL bounds a batch's lock waits by the transactional wait bound.
var batchLockSQL = pgSetLocal("lock_timeout", pgInterval(DefaultTxLockWait))

// runBatch runs sql in one transaction under the batch lock wait,
// pipelined in one round trip, with the arguments args builds once a
// connection is in hand (nil: nothing left to send), reading its rows with
// each.
func (s *PostgresStore) runBatch(ctx context.Context, sql string, args func() []any, each func(pgx.Rows) error) error {
	return s.withConn(ctx, func(c pgConn) error {
		a := args()
		if a == nil {
			return nil
		}
		b := &pgx.Batch{}
		b.Queue(pgsql.BeginSQL)
		b.Queue(batchLockSQL)
		b.Queue(pgsql.NoSeqScanSQL)
		b.Queue(sql, a...)
		b.Queue(pgsql.CommitSQL)
		br := c.SendBatch(ctx, b)
		err := readBatch(br, each)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err // a connection left in the failed transaction leaves the pool on release
	})
}

// readBatch reads runBatch's five results.
func readBatch(br pgx.BatchResults, each func(pgx.Rows) error) error {
	for range 3 {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
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
	if err := rows.Err(); err != nil {
		return err
	}
	_, err = br.Exec()
	return err
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

// sameRow reports whether a claim names rec's row.
func (c *claimCall) sameRow(rec *Record) bool {
	return c.req.Key == rec.Key && c.req.Scope == rec.Scope && c.req.Endpoint == rec.Endpoint
}

// sameClaim reports whether two claims name one row.
func sameClaim(a, b *claimCall) bool {
	return a.req.Key == b.req.Key && a.req.Scope == b.req.Scope && a.req.Endpoint == b.req.Endpoint
}

// Claim implements Store in one round trip, alone or in a batch.
func (s *PostgresStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	b := s.batch.Load()
	if b == nil || !batchable(req.Key, req.Scope, req.Endpoint, req.DeriveKeyID) {
		return s.claimAlone(ctx, req)
	}
	if !b.claims.take(b.slots) {
		c := &claimCall{req: req}
		c.ctx, c.done = ctx, make(chan struct{})
		if !b.claims.enter(c, b.slots) {
			return s.claimQueued(ctx, b, c)
		}
	}
	res, err := s.claimAlone(ctx, req)
	handOn(&b.claims, b.max, s.claimBatch)
	return res, err
}

// claimQueued waits for a queued claim's batch, or claims alone when
// waitBatched says so.
func (s *PostgresStore) claimQueued(ctx context.Context, b *batching, c *claimCall) (ClaimResult, error) {
	switch alone, err := waitBatched(ctx, &b.claims, c); {
	case alone:
		return s.claimAlone(ctx, c.req)
	case err != nil:
		return ClaimResult{}, pgStoreError("claim", err)
	}
	return c.res, c.err
}

// claimBatch claims calls' keys in one statement and commit. A second call
// for a key waits for the first's answer, then claims alone: it reads the
// first's row and loses, as a duplicate does. A key the statement returned
// no row for (its row committed after the statement's snapshot), and every
// key of a batch that failed for a reason of its own (answersBatch), is
// claimed alone. A call its caller withdrew is never sent.
func (s *PostgresStore) claimBatch(calls []*claimCall) {
	batch, dups := firsts(calls, sameClaim)
	var got []ClaimResult // got[i] is batch[i]'s row, when its Record.ID is set
	if len(batch) > 1 {
		var err error
		if got, err = s.claimBatchRows(batch); err != nil && answersBatch(err) {
			serr := pgStoreError("claim", err)
			for _, c := range calls {
				c.answer(ClaimResult{}, serr)
			}
			return
		}
	}
	for i, c := range batch {
		var rest []*claimCall
		if dups != nil {
			rest = dups[i]
		}
		ok := got != nil && got[i].Record.ID != 0
		if ok && len(rest) == 0 { // the common case: answered by the batch
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

// claimBatchRows runs pgsql.ClaimBatchSQL for the calls of batch still
// pending when a connection is in hand: once the batch committed, got[i]
// is batch[i]'s row (a zero Record.ID where the statement returned none).
func (s *PostgresStore) claimBatchRows(batch []*claimCall) (got []ClaimResult, err error) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	read := make([]ClaimResult, len(batch))
	var sc claimScanner
	err = s.runBatch(ctx, pgsql.ClaimBatchSQL, func() []any { return claimBatchArgs(batch) }, func(rows pgx.Rows) error {
		var res ClaimResult
		if err := sc.scan(rows, &res.Record, &res.Won); err != nil {
			return err
		}
		for i, c := range batch {
			if c.sameRow(&res.Record) {
				read[i] = res
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return read, nil
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

// complete writes r to its row, alone or in a batch (a record that wakes
// waiters goes alone: pgsql.WakeSQL follows it); a lone record allocates
// nothing to be batched.
func (s *PostgresStore) complete(ctx context.Context, r *record) error {
	b := s.batch.Load()
	if b == nil || r.f.wake || !batchable(r.f.Key, r.f.Scope, r.f.Endpoint) {
		return s.completeAlone(ctx, r)
	}
	if !b.records.take(b.slots) {
		c := &recordCall{record: *r}
		c.ctx, c.done = ctx, make(chan struct{})
		if !b.records.enter(c, b.slots) {
			return s.completeQueued(ctx, b, c)
		}
	}
	err := s.completeAlone(ctx, r)
	handOn(&b.records, b.max, s.completeBatch)
	return err
}

// completeQueued waits for a queued record's batch, or records alone when
// waitBatched says so (claimQueued's twin).
func (s *PostgresStore) completeQueued(ctx context.Context, b *batching, c *recordCall) error {
	switch alone, err := waitBatched(ctx, &b.records, c); {
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

// completeBatch records calls' responses in one statement and commit; a
// second call for a row goes alone after it, as do all of them when the
// batch failed for a reason of its own (answersBatch).
func (s *PostgresStore) completeBatch(calls []*recordCall) {
	batch, dups := firsts(calls, func(a, b *recordCall) bool { return a.f.ID == b.f.ID })
	var alone []*recordCall
	for _, d := range dups {
		alone = append(alone, d...)
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	recorded := make([]bool, len(batch))
	err := s.runBatch(ctx, pgsql.CompleteBatchSQL, func() []any { return recordBatchArgs(batch) }, func(rows pgx.Rows) error {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return err
		}
		for i, c := range batch {
			if c.f.ID == id {
				recorded[i] = true
				break
			}
		}
		return nil
	})
	switch {
	case err != nil && answersBatch(err):
		serr := pgStoreError("complete", err)
		for _, c := range calls {
			c.answer(serr)
		}
		return
	case err != nil:
		alone = calls
	default:
		for i, c := range batch {
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
