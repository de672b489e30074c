package sandbox

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/sandbox/boxinit"
)

// HelperEnv is the whole environment of the privileged helpers the server
// starts: bubblewrap and the init child (host root until the uid switch).
// Fixed here, never built from a Spec: a session's variables reach only the
// user program (see Spec.Env and boxinit.Policy.EnvFD).
var HelperEnv = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}

// refusedEnvNames are variables a session may not set: what the dynamic
// loader and libc obey (glibc drops exactly these for setuid programs,
// unsecvars.h), what shells obey at start-up, and what the server itself
// sets per session. Each maps to why, for the error message.
var refusedEnvNames = map[string]string{
	"GCONV_PATH":       "libc loads character-set converters from it",
	"GETCONF_DIR":      "libc reads configuration from it",
	"GLIBC_TUNABLES":   "it tunes libc's allocator and loader in every program",
	"HOSTALIASES":      "the resolver reads host aliases from it",
	"LOCALDOMAIN":      "it changes the resolver's search domains",
	"LOCPATH":          "libc loads locale data from it",
	"NIS_PATH":         "libc's NIS lookups obey it",
	"NLSPATH":          "libc loads message catalogs from it",
	"RESOLV_HOST_CONF": "the resolver reads configuration from it",
	"RES_OPTIONS":      "it changes the resolver's options",
	"TZDIR":            "libc loads time zone data from it",
	"BASH_ENV":         "bash runs the file it names before any script",
	"ENV":              "sh runs the file it names at start-up",
	"SHELLOPTS":        "it turns on bash options (xtrace with PS4 runs code) in every bash script",
	"BASHOPTS":         "it turns on bash options in every bash script",
	"TMPDIR":           "the server sets it to the session's temporary directory",
}

// refusedEnvPrefixes are refused as prefixes of a name.
var refusedEnvPrefixes = map[string]string{
	"LD_":     "the dynamic loader obeys LD_* variables (LD_PRELOAD and LD_LIBRARY_PATH load code into every program)",
	"MALLOC_": "libc's allocator obeys MALLOC_* variables (MALLOC_CHECK_, MALLOC_PERTURB_…)",
}

// CheckEnvName reports why name cannot be a session variable, or nil. A
// name must be an identifier (letters, digits and _, not starting with a
// digit) and none of the variables the loader, libc or a shell obey at
// start-up (LD_*, MALLOC_*, GLIBC_TUNABLES, GCONV_PATH, BASH_ENV…), nor
// TMPDIR, which the server sets.
func CheckEnvName(name string) error {
	if !ValidEnvName(name) {
		return fmt.Errorf("variable name %q is not allowed: use letters, digits and _, not starting with a digit", name)
	}
	if why, ok := refusedEnvNames[name]; ok {
		return fmt.Errorf("variable %s cannot be set: %s; the sandbox refuses the names the loader, libc or a shell obey at start-up", name, why)
	}
	for p, why := range refusedEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return fmt.Errorf("variable %s cannot be set: %s; the sandbox refuses the names the loader, libc or a shell obey at start-up", name, why)
		}
	}
	return nil
}

// CheckEnv reports why env cannot be given to a run, or nil: a name
// CheckEnvName refuses, or a value holding a NUL byte (which an
// environment cannot carry). Names are checked in order, so the error is
// the same each time.
func CheckEnv(env map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if err := CheckEnvName(k); err != nil {
			return err
		}
		if strings.ContainsRune(env[k], 0) {
			return fmt.Errorf("the value of %s holds a NUL byte, which an environment cannot carry", k)
		}
	}
	return nil
}

// ValidEnvName reports whether name is an identifier: letters, digits and _,
// not starting with a digit.
func ValidEnvName(name string) bool {
	if name == "" {
		return false
	}
	for i, c := range name {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// envFile returns a sealed memfd holding env for the init child
// (boxinit.Policy.EnvFD): read-only to everyone once it is sealed, and in
// no command line.
func envFile(env []string) (*os.File, error) {
	b := boxinit.EncodeEnv(env)
	if len(b) > boxinit.MaxEnvBytes || len(env) > boxinit.MaxEnvVars {
		return nil, fmt.Errorf("%w: the environment is %d bytes in %d variables; the limit is %d bytes and %d variables",
			ErrInvalidSpec, len(b), len(env), boxinit.MaxEnvBytes, boxinit.MaxEnvVars)
	}
	fd, err := unix.MemfdCreate("quro-env", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("environment memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "quro-env")
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, fmt.Errorf("environment memfd: %w", err)
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("environment memfd seals: %w", err)
	}
	return f, nil
}

// RefusedEnvExamples lists one name of each kind CheckEnvName refuses, for
// tests and documentation.
var RefusedEnvExamples = func() []string {
	names := []string{"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_DEBUG_OUTPUT", "LD_ORIGIN_PATH", "LD_PROFILE",
		"MALLOC_CHECK_", "MALLOC_PERTURB_", "MALLOC_TRACE", "MALLOC_ARENA_MAX"}
	for n := range refusedEnvNames {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}()
