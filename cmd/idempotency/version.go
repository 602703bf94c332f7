package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
)

func versionHelp(w io.Writer) {
	fmt.Fprint(w, `Usage: idempotency version [--json]

Prints the module version the CLI was built from (runtime/debug build
info): a release tag such as v0.1.0 when installed with
go install github.com/idemkit/idempotency/cmd/idempotency@v0.1.0; a
pseudo-version (v0.0.0-DATE-REVISION, +dirty with uncommitted changes)
for go build or go install in a git checkout, with the revision and
whether the tree was modified; (devel) when the build recorded no VCS
state (go run, -buildvcs=false). And the Go version. --json prints
module, version, revision and modified (when recorded) and go. Needs no
database.

Example:
  idempotency version --json
`)
}

// readBuildInfo is debug.ReadBuildInfo, replaced in tests.
var readBuildInfo = debug.ReadBuildInfo

// versionInfo is what version prints.
type versionInfo struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Modified *bool  `json:"modified,omitempty"` // nil: the build recorded no VCS state
	Go       string `json:"go"`
}

func runVersion(_ context.Context, c *cli, args []string) error {
	flags := c.flagSet("version")
	pos, err := c.parse(flags, args, versionHelp)
	if err != nil {
		return err
	}
	if err := noArgs("version", pos); err != nil {
		return err
	}
	bi, ok := readBuildInfo()
	if !ok {
		return fmt.Errorf("no build information in this binary (built without module support)")
	}
	v := versionInfo{Module: bi.Main.Path, Version: bi.Main.Version, Go: bi.GoVersion}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			modified := s.Value == "true"
			v.Modified = &modified
		}
	}
	if c.g.json {
		return c.writeJSON(v)
	}
	line := fmt.Sprintf("idempotency %s (module %s, %s", v.Version, v.Module, v.Go)
	if v.Revision != "" {
		line += ", revision " + v.Revision
		if v.Modified != nil && *v.Modified {
			line += " modified"
		}
	}
	_, err = fmt.Fprintln(c.stdout, line+")")
	return err
}
