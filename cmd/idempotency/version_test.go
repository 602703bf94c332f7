package main

import (
	"encoding/json"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersion is not parallel: it replaces readBuildInfo.
func TestVersion(t *testing.T) {
	r := runCLI(t, nil, "version")
	wantCode(t, r, exitOK)
	if !strings.HasPrefix(r.stdout, "idempotency ") || !strings.Contains(r.stdout, "go1.") {
		t.Fatalf("version of the test binary: %q", r.stdout)
	}

	defer func(f func() (*debug.BuildInfo, bool)) { readBuildInfo = f }(readBuildInfo)
	readBuildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/idemkit/idempotency", Version: "v1.4.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0cdef35"}, {Key: "vcs.modified", Value: "true"}}}, true
	}
	r = runCLI(t, nil, "version")
	wantCode(t, r, exitOK)
	if want := "idempotency v1.4.0 (module github.com/idemkit/idempotency, go1.26.8, revision 0cdef35 modified)\n"; r.stdout != want {
		t.Fatalf("version: %q, want %q", r.stdout, want)
	}
	r = runCLI(t, nil, "version", "--json")
	wantCode(t, r, exitOK)
	var v versionInfo
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Version != "v1.4.0" || v.Module != "github.com/idemkit/idempotency" || v.Revision != "0cdef35" || !v.Modified {
		t.Fatalf("version --json: %+v, %v\n%s", v, err, r.stdout)
	}
	readBuildInfo = func() (*debug.BuildInfo, bool) { return nil, false }
	wantCode(t, runCLI(t, nil, "version"), exitFailure)
}
