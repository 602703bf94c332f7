//go:build !linux

package testdb

import (
	"os/exec"
	"os/user"
)

// setProcAttr does nothing outside Linux: PgBouncer runs as this process's
// user (and refuses to when that is root).
func setProcAttr(*exec.Cmd, *user.User) {}
