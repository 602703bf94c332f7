// Command idempotency is the operator CLI for the idempotency_keys table of
// github.com/idemkit/idempotency: migrations, cleanup of expired keys, GDPR
// erasure and export, inspection, lists of stale and failed keys, the
// release of one stuck key, the reseal of stored responses with a new seal
// key, and the version it was built from.
//
//	go run github.com/idemkit/idempotency/cmd/idempotency --help
//
// The database URL comes from --database-url or DATABASE_URL (the flag
// wins). A mysql:// URL (or a go-sql-driver DSN) selects MySQL/MariaDB,
// sqlstore's MySQL dialect, for every command. Output is text by default,
// one JSON document with --json; export and list --json write JSON lines.
// Exit status: 0 success, 1 runtime failure, 2 usage error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // the database is unreachable, a query failed, the table is missing
	exitUsage   = 2 // unknown command, bad flag, malformed key or user
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// command is one subcommand.
type command struct {
	name    string
	summary string // one line for the command list
	run     func(ctx context.Context, c *cli, args []string) error
}

// commands in the order the help lists them.
var commands = []command{
	{"migrate", "apply, roll back or show the embedded migrations (up | down --yes | version)", runMigrate},
	{"cleanup", "delete expired keys in batches (--dry-run counts them)", runCleanup},
	{"erase", "delete every key of a user scope, the GDPR erasure (--user required)", runErase},
	{"export", "print every key of a user scope as JSON lines, GDPR access (--user required)", runExport},
	{"inspect", "show a key's rows: status, times, staleness (--key required)", runInspect},
	{"list", "list stale in-flight keys, failed keys, or counts per endpoint (--stale | --failed | --counts)", runList},
	{"stats", "count keys by status, in flight past their lease, awaiting cleanup, by seal key", runStats},
	{"reseal", "seal completed keys' responses with the active seal key, in fenced batches (--dry-run)", runReseal},
	{"release", "delete one failed or stale key so its next retry executes again (--key, --yes)", runRelease},
	{"version", "print the module version the CLI was built from", runVersion},
}

// run is the whole program: it parses args, runs one command and returns
// the exit status. Output goes to stdout, diagnostics to stderr; getenv
// reads the environment (DATABASE_URL).
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c := &cli{stdout: stdout, stderr: stderr, getenv: getenv}
	c.g.timeout = defaultTimeout

	// Global flags may come before the command too.
	fs := c.flagSet("idempotency")
	err := fs.Parse(args)
	if err == nil && fs.NArg() == 0 {
		return c.fail("", usagef("no command given (commands: %s; see idempotency --help)", commandNames()))
	}
	if err != nil {
		if isHelp(err) {
			c.printMainUsage(stdout)
			return exitOK
		}
		return c.fail("", usagef("%v (see idempotency --help)", err))
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		if len(rest) == 0 {
			c.printMainUsage(stdout)
			return exitOK
		}
		name, rest = rest[0], []string{"--help"}
	}
	for _, cmd := range commands {
		if cmd.name == name {
			return c.fail(name, cmd.run(ctx, c, rest))
		}
	}
	return c.fail("", usagef("unknown command %q (commands: %s; see idempotency --help)", name, commandNames()))
}

func commandNames() string {
	names := make([]string, len(commands))
	for i, cmd := range commands {
		names[i] = cmd.name
	}
	return strings.Join(names, ", ")
}

// fail prints err, if any, as one line and returns the exit status for it.
func (c *cli) fail(cmd string, err error) int {
	if err == nil || errors.Is(err, errHelpShown) {
		return exitOK
	}
	prefix := "idempotency"
	if cmd != "" {
		prefix += " " + cmd
	}
	fmt.Fprintf(c.stderr, "%s: %s\n", prefix, oneLine(err.Error()))
	var ue *usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitFailure
}

// oneLine folds a multi-line message (pgx reports several addresses that
// way) onto one line.
func oneLine(s string) string {
	var lines []string
	for _, l := range strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' }) {
		l = strings.TrimSpace(l)
		if l != "" && !slices.Contains(lines, l) { // sslmode=prefer reports each address twice
			lines = append(lines, l)
		}
	}
	return strings.ReplaceAll(strings.Join(lines, "; "), ":; ", ": ")
}

// usageError is a bad command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errHelpShown reports that --help was asked for and answered: exit 0.
var errHelpShown = errors.New("help shown")

func (c *cli) printMainUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: idempotency [global flags] <command> [flags]

Operator commands for the idempotency_keys table of github.com/idemkit/idempotency.

Commands:
`)
	for _, cmd := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", cmd.name, cmd.summary)
	}
	fmt.Fprint(w, `
Global flags (before or after the command):
`)
	printFlags(w, c.flagSet("idempotency"))
	fmt.Fprint(w, `
Exit status: 0 success; 1 runtime failure (database unreachable, query failed,
table missing); 2 usage error (unknown command, bad flag, malformed key or user).

Example:
  DATABASE_URL=postgres://app@db:5432/app idempotency stats
  DATABASE_URL=mysql://app@db:3306/app idempotency stats   (MySQL/MariaDB: every command)

Run 'idempotency <command> --help' for a command's flags and an example.
`)
}
