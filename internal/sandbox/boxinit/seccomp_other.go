//go:build !amd64 && !arm64

package boxinit

import "syscall"

const sysSeccomp = -1

const sysWaitidNum = syscall.SYS_WAITID
