package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idempotency"
)

// envDatabaseURL is read when --database-url is not given.
const envDatabaseURL = "DATABASE_URL"

// defaultTimeout is the default deadline of each database statement.
const defaultTimeout = 30 * time.Second

// cli is the state shared by the commands: where output goes and the global
// flags.
type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	g              globals
	mysql          bool // the command opened a MySQL/MariaDB database
}

// globals are the flags every command accepts.
type globals struct {
	databaseURL  optString
	sealKeysFile optString
	json         bool
	timeout      time.Duration
}

// optString is a string flag that remembers whether it was given, so that
// an empty --user (the unscoped scope, given on purpose) differs from no
// --user at all.
type optString struct {
	v   string
	set bool
}

func (o *optString) String() string { return o.v }

func (o *optString) Set(s string) error {
	o.v, o.set = s, true
	return nil
}

// durationFlag parses Go durations with an error that says what is wanted.
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return errors.New("want a Go duration such as 500ms, 30s or 2m")
	}
	*f.d = d
	return nil
}

// flagSet returns a flag set holding the global flags. Their current values
// are the defaults, so flags given before the command survive a command's
// own flag set.
func (c *cli) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned and printed as one line
	fs.Var(&c.g.databaseURL, "database-url", "PostgreSQL or mysql:// `URL` (env "+envDatabaseURL+"; the flag wins; every command works on both)")
	fs.Var(&c.g.sealKeysFile, "seal-keys-file", "read the seal keys from `PATH` (the format of "+envSealKeys+", which is read when this is not given)")
	fs.BoolVar(&c.g.json, "json", c.g.json, "print one JSON document instead of text")
	fs.Var(durationFlag{&c.g.timeout}, "timeout", "deadline of each database statement, a `DURATION` such as 30s or 2m (default 30s)")
	return fs
}

// parse parses a command's arguments, allowing flags after positional
// arguments (migrate down --yes), and returns the positional arguments.
// --help prints the command's help to stdout and returns errHelpShown.
func (c *cli) parse(fs *flag.FlagSet, args []string, help func(io.Writer)) ([]string, error) {
	var pos []string
	for {
		err := fs.Parse(args)
		if isHelp(err) {
			help(c.stdout)
			fmt.Fprintln(c.stdout, "\nFlags:")
			printFlags(c.stdout, fs)
			return nil, errHelpShown
		}
		if err != nil {
			return nil, usagef("%v (see idempotency %s --help)", err, fs.Name())
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if c.g.timeout <= 0 {
		return nil, usagef("--timeout must be positive, got %v", c.g.timeout)
	}
	return pos, nil
}

// isHelp reports -h, -help or --help.
func isHelp(err error) bool { return errors.Is(err, flag.ErrHelp) }

// noArgs returns a usage error for unexpected positional arguments.
func noArgs(cmd string, pos []string) error {
	if len(pos) > 0 {
		return usagef("unexpected argument %q (see idempotency %s --help)", pos[0], cmd)
	}
	return nil
}

// printFlags lists fs's flags GNU style (--name VALUE), the command's own
// flags first.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	var own, global []string
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		head := "--" + f.Name
		if name != "" {
			head += " " + name
		}
		line := fmt.Sprintf("  %-22s %s", head, usage)
		switch f.Name {
		case "database-url", "json", "timeout":
			global = append(global, line)
		default:
			own = append(own, line)
		}
	})
	for _, l := range append(own, global...) {
		fmt.Fprintln(w, l)
	}
}

// writeJSON writes v as one JSON document on stdout.
func (c *cli) writeJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parseKey validates an idempotency key as the middleware's routes do and
// returns the stored forms it may have: a UUID (any case, optionally in
// double quotes) as a UUID route stores it, lower case, and as an opaque
// route stores it, exactly; any other key of 1-255 visible ASCII
// characters or spaces (bare or as a structured-field string) exactly.
func parseKey(v string) ([]string, error) {
	opaque, err := idempotency.ParseKey(v, idempotency.KeyOpaque)
	if err != nil {
		return nil, usagef("malformed --key %q: want a UUID such as 0b3e1a5c-7a1f-4c1e-9f3d-2f6a8c9b1d20, "+
			"or an opaque key of 1-255 visible ASCII characters or spaces, optionally in double quotes with \\\" and \\\\ escapes", v)
	}
	if u, err := idempotency.ParseKey(v, idempotency.KeyUUID); err == nil && u != opaque {
		return []string{u, opaque}, nil
	}
	return []string{opaque}, nil
}

// checkUser rejects a user scope no row can have: Postgres text holds
// neither NUL bytes nor invalid UTF-8.
func checkUser(u string) error {
	if !utf8.ValidString(u) || strings.IndexByte(u, 0) >= 0 {
		return usagef("malformed --user %q: want valid UTF-8 without NUL bytes", u)
	}
	return nil
}

// scopeFlags returns the user scope of erase and export, which must be
// named explicitly: --user with a non-empty ID, or --unscoped for the keys
// stored without a user. An empty --user is refused, so that an empty
// shell variable (--user "$USER_ID") never selects every unscoped key.
func scopeFlags(cmd string, u optString, unscoped bool) (string, error) {
	switch {
	case unscoped && u.set:
		return "", usagef("--user and --unscoped exclude each other (see idempotency %s --help)", cmd)
	case unscoped:
		return "", nil
	case !u.set:
		return "", usagef("--user ID or --unscoped is required (the user scope to %s; --unscoped for keys stored without a user)", cmd)
	case u.v == "":
		return "", usagef("--user is empty: give a user ID, or --unscoped for keys stored without a user")
	}
	return u.v, checkUser(u.v)
}

// optionalScope is scopeFlags for the commands that may also run without
// a scope (inspect searches every scope, list and reseal read them all):
// scoped is false when neither --user nor --unscoped was given.
func optionalScope(cmd string, u optString, unscoped bool) (scope string, scoped bool, err error) {
	if !u.set && !unscoped {
		return "", false, nil
	}
	scope, err = scopeFlags(cmd, u, unscoped)
	return scope, err == nil, err
}

// scopeVars adds --user and --unscoped to flags; verb says what the scope
// is for.
func scopeVars(flags *flag.FlagSet, verb string) (*optString, *bool) {
	var user optString
	flags.Var(&user, "user", "the user scope `ID` (scope_user_id) to "+verb+"; never empty")
	unscoped := flags.Bool("unscoped", false, verb+" the keys stored without a user (the '' scope) instead of a user's")
	return &user, unscoped
}

// parseScopeCommand parses the flags of a command that acts on one user
// scope (erase, export): --user ID or --unscoped, and nothing else.
func parseScopeCommand(c *cli, cmd string, args []string, help func(io.Writer), verb string) (string, error) {
	flags := c.flagSet(cmd)
	user, unscoped := scopeVars(flags, verb)
	pos, err := c.parse(flags, args, help)
	if err != nil {
		return "", err
	}
	if err := noArgs(cmd, pos); err != nil {
		return "", err
	}
	return scopeFlags(cmd, *user, *unscoped)
}

// describeUser names a user scope for messages.
func describeUser(u string) string {
	if u == "" {
		return "the unscoped ('') scope"
	}
	return fmt.Sprintf("user %q", u)
}

// statementContext returns a context bounded by --timeout.
func (c *cli) statementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.g.timeout)
}
