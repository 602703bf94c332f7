package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/idemkit/idempotency"
)

// maxBatch bounds --batch: a batch holds its rows' locks until it commits.
const maxBatch = 100_000

func cleanupHelp(w io.Writer) {
	fmt.Fprintf(w, `Usage: idempotency cleanup [--batch N] [--dry-run] [flags]

Deletes the keys past their retention (retain_until: their expiry, or for a
tombstone of an ExpiredRefuse route its grace after it) and purges the stored
responses of expired tombstones, batch after batch, until a batch comes back
short; the counts include the purged rows. Expired in_flight orphans whose
lease is over go too; an in_flight key whose lease still runs is never
deleted. Safe while the table is live: each batch reads expired rows without
locking them and deletes them with one short DELETE per user scope that checks
them again, and --timeout bounds each batch. A progress line goes to stderr
every --progress.

--dry-run counts the rows that would be deleted (the same predicate; not the
tombstones that would only be purged) and changes nothing.

Example (nightly, 04:00 UTC):
  0 4 * * * DATABASE_URL=postgres://app@db:5432/app idempotency cleanup --batch 1000
`)
}

func runCleanup(ctx context.Context, c *cli, args []string) error {
	flags := c.flagSet("cleanup")
	batch := flags.Int("batch", 1000, fmt.Sprintf("delete at most `N` rows per statement, 1 to %d (default 1000)", maxBatch))
	dryRun := flags.Bool("dry-run", false, "count the rows that would be deleted; delete nothing")
	progress := 10 * time.Second
	flags.Var(durationFlag{&progress}, "progress", "print a progress line to stderr every `DURATION` of a long cleanup; 0 never (default 10s)")
	pos, err := c.parse(flags, args, cleanupHelp)
	if err != nil {
		return err
	}
	if err := noArgs("cleanup", pos); err != nil {
		return err
	}
	if *batch < 1 || *batch > maxBatch {
		return usagef("--batch must be between 1 and %d, got %d", maxBatch, *batch)
	}
	if progress < 0 {
		return usagef("--progress must not be negative, got %v", progress)
	}

	db, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()

	if *dryRun {
		sctx, cancel := c.statementContext(ctx)
		defer cancel()
		n, err := db.countCleanup(sctx)
		if err != nil {
			return c.dbError(ctx, "count expired keys", err)
		}
		if c.g.json {
			return c.writeJSON(struct {
				DryRun      bool  `json:"dry_run"`
				WouldDelete int64 `json:"would_delete"`
			}{true, n})
		}
		_, err = fmt.Fprintf(c.stdout, "would delete %d expired %s (dry run: nothing deleted)\n", n, rows(n))
		return err
	}

	start := time.Now()
	lastProgress := start
	deleted, batches, err := c.cleanupBatches(ctx, db.store, *batch, func(deleted, batches int64) {
		if progress > 0 && time.Since(lastProgress) >= progress {
			lastProgress = time.Now()
			fmt.Fprintf(c.stderr, "cleanup: %d %s deleted so far (%d batches, %v)\n",
				deleted, rows(deleted), batches, time.Since(start).Round(time.Second))
		}
	})
	if err != nil {
		return c.dbError(ctx, fmt.Sprintf("delete expired keys (after deleting %d %s)", deleted, rows(deleted)), err)
	}
	elapsed := time.Since(start)
	if c.g.json {
		return c.writeJSON(struct {
			Deleted        int64   `json:"deleted"`
			Batches        int64   `json:"batches"`
			ElapsedSeconds float64 `json:"elapsed_seconds"`
		}{deleted, batches, math.Round(elapsed.Seconds()*1000) / 1000})
	}
	_, err = fmt.Fprintf(c.stdout, "deleted %d expired %s in %d %s (%v)\n",
		deleted, rows(deleted), batches, plural(batches, "batch", "batches"), elapsed.Round(time.Millisecond))
	return err
}

// cleanupBatches deletes expired rows of store, batch rows per store call,
// each under --timeout, until a batch comes back short or ctx ends; it
// calls progress after each batch with the rows deleted and the batches
// run so far.
func (c *cli) cleanupBatches(ctx context.Context, store idempotency.Store, batch int, progress func(deleted, batches int64)) (deleted, batches int64, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return deleted, batches, err
		}
		sctx, cancel := c.statementContext(ctx)
		n, err := store.Cleanup(sctx, batch)
		cancel()
		deleted += n
		batches++
		if err != nil {
			return deleted, batches, err
		}
		progress(deleted, batches)
		if n < int64(batch) {
			return deleted, batches, nil
		}
	}
}

func rows(n int64) string { return plural(n, "row", "rows") }

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
