// Package version tells which quro this is.
package version

import "runtime/debug"

// Version is set at build time with -ldflags "-X github.com/quro-dev/quro/internal/version.Version=v1.2.3".
var Version = "dev"

// String returns the version, with the VCS revision when the build has one.
func String() string {
	v := Version
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += "+" + s.Value[:12]
			}
		}
	}
	return v
}
