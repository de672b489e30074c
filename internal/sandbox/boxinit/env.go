package boxinit

import (
	"errors"
	"strconv"
	"syscall"
)

// The user program's environment travels from the server to the init child
// in a descriptor (Policy.EnvFD), never in argv or in the environment of
// bubblewrap and the init child: those run with privileges (host root
// before the uid switch), and a variable such as LD_PRELOAD or
// GLIBC_TUNABLES in their environment would act on them. The descriptor
// holds entries "NAME=VALUE", each followed by a NUL byte.

// Bounds on what the init child accepts, checked before anything is
// allocated for it: what execve takes is bounded too (a quarter of the
// stack limit for argv and envp together).
const (
	MaxEnvBytes = 1 << 20
	MaxEnvVars  = 4096
)

// EncodeEnv renders env ("NAME=VALUE" entries) for the descriptor. The
// caller has already refused names and values with NUL bytes.
func EncodeEnv(env []string) []byte {
	n := 0
	for _, kv := range env {
		n += len(kv) + 1
	}
	b := make([]byte, 0, n)
	for _, kv := range env {
		b = append(b, kv...)
		b = append(b, 0)
	}
	return b
}

// ParseEnv parses what EncodeEnv rendered, refusing anything else: more
// than MaxEnvBytes or MaxEnvVars, an entry without "=" or with an empty
// name, an unterminated last entry, a name given twice.
func ParseEnv(b []byte) ([]string, error) {
	bad := func(why string) ([]string, error) { return nil, errors.New("bad environment: " + why) }
	if len(b) > MaxEnvBytes {
		return bad("more than " + strconv.Itoa(MaxEnvBytes) + " bytes")
	}
	if len(b) == 0 {
		return []string{}, nil
	}
	if b[len(b)-1] != 0 {
		return bad("the last entry is not terminated")
	}
	count := 0
	for _, c := range b {
		if c == 0 {
			count++
		}
	}
	if count > MaxEnvVars {
		return bad("more than " + strconv.Itoa(MaxEnvVars) + " variables")
	}
	env := make([]string, 0, count)
	seen := make(map[string]bool, count)
	for start := 0; start < len(b); {
		end := start
		for b[end] != 0 {
			end++
		}
		kv := string(b[start:end])
		start = end + 1
		name, _, ok := cut(kv, '=')
		if !ok || name == "" {
			return bad("entry " + strconv.Itoa(len(env)) + " is not NAME=VALUE")
		}
		if seen[name] {
			return bad(strconv.Quote(name) + " is given twice")
		}
		seen[name] = true
		env = append(env, kv)
	}
	return env, nil
}

// readEnv reads and closes the environment descriptor: at most
// MaxEnvBytes+1 bytes from offset 0 (pread: the server wrote it and left
// its offset at the end).
func readEnv(fd int) ([]string, error) {
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, errors.New("environment fd: " + err.Error())
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, errors.New("environment fd: not a regular file")
	}
	if st.Size > MaxEnvBytes {
		return nil, errors.New("bad environment: more than " + strconv.Itoa(MaxEnvBytes) + " bytes")
	}
	b := make([]byte, st.Size+1)
	n := 0
	for n < len(b) {
		m, err := syscall.Pread(fd, b[n:], int64(n))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, errors.New("environment fd: " + err.Error())
		}
		if m == 0 {
			break
		}
		n += m
	}
	if n != int(st.Size) {
		return nil, errors.New("bad environment: the descriptor changed while it was read")
	}
	return ParseEnv(b[:n])
}

// lookupEnv is the value of name in env, or "".
func lookupEnv(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if k, val, _ := cut(kv, '='); k == name {
			v = val
		}
	}
	return v
}
