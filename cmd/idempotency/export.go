package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
)

func exportHelp(w io.Writer) {
	fmt.Fprint(w, `Usage: idempotency export (--user ID | --unscoped) [flags]

Writes every stored key of one user scope, oldest first, as JSON lines on
stdout (one object per key), for a GDPR access or portability request.
--user ID names the user; --unscoped exports the keys stored without a user
instead. An empty --user is refused (exit status 2). The output is always
JSON lines, --json or not; a count goes to stderr.

Fields: key, user, endpoint, request_hash, status (in_flight, completed,
failed), attempt, response_code (null when none is recorded),
response_body_kind (json, raw or none), response_headers (object of string
arrays, when recorded), response_body (a JSON body, as JSON),
response_body_base64 (any other body, standard base64), created_at,
locked_at, locked_until, expires_at (RFC 3339, UTC).

Sealed responses (README "Sealing stored responses") are opened with the
keys of IDEMPOTENCY_SEAL_KEYS or --seal-keys-file; a row that does not open
fails the export (exit status 1) and nothing is written.

Example:
  idempotency export --user 42 > user-42-idempotency.jsonl
`)
}

func runExport(ctx context.Context, c *cli, args []string) error {
	scope, err := parseScopeCommand(c, "export", args, exportHelp, "export")
	if err != nil {
		return err
	}

	db, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()

	sctx, cancel := c.statementContext(ctx)
	defer cancel()
	store, err := c.readStore(sctx, db.store)
	if err != nil {
		return err
	}
	recs, err := store.ExportScope(sctx, scope)
	if err != nil {
		return c.dbError(ctx, "read the user's keys", err)
	}
	for _, r := range recs {
		if r.Response.SealKeyID != "" { // read without the key: never export ciphertext as the response
			return sealedError(r)
		}
	}

	w := bufio.NewWriter(c.stdout)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, r := range recs {
		if err := enc.Encode(newRecordJSON(r)); err != nil {
			return fmt.Errorf("write export: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("write export: %w", err)
	}
	n := int64(len(recs))
	fmt.Fprintf(c.stderr, "exported %d %s of %s\n", n, rows(n), describeUser(scope))
	return nil
}
