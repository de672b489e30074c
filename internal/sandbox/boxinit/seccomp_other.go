//go:build !amd64 && !arm64

package boxinit

const sysSeccomp = -1
