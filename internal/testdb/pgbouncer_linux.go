package testdb

import (
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
)

// setProcAttr makes cmd run as u (when not nil) and die with this process,
// so a test binary that crashes leaves no PgBouncer behind.
func setProcAttr(cmd *exec.Cmd, u *user.User) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if u != nil {
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
}
