package main

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The serve marker: quro serve writes <data>/run/serve.json when it starts
// listening and removes it when it stops, so that the CLI commands on the
// same data directory (run, exec, term, session, call) go through the
// running server — one set of sessions, one state, one audit — instead of
// opening the data directory a second time in-process.
//
// The CLI sends the data directory's admin token to the address in the
// marker, so it trusts the marker only when it cannot have been planted or
// left stale: the file is owned by the CLI's user (or the CLI is root) and
// writable by nobody else, the pid in it is alive and the same user's, and
// every socket listening where a connection to the address would land
// belongs to that user, who also owns the data directory (see findServer).

// ServeMarker is <data>/run/serve.json.
const ServeMarker = "run/serve.json"

// serveMarker is the content of ServeMarker.
type serveMarker struct {
	URL     string    `json:"url"` // http://IP:PORT, an address that reaches the server from this machine
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
}

// writeServeMarker writes the marker of a server listening on addr and
// returns the function that removes it (only while it is still this
// process's: a later server on the same data directory owns its own).
func writeServeMarker(dataDir string, addr net.Addr, log *slog.Logger) func() {
	file := filepath.Join(dataDir, ServeMarker)
	m := serveMarker{URL: "http://" + localAddr(addr), PID: os.Getpid(), Started: time.Now().UTC()}
	b, _ := json.Marshal(m)
	err := os.MkdirAll(filepath.Dir(file), 0o700)
	if err == nil {
		tmp := fmt.Sprintf("%s.%d.tmp", file, m.PID)
		if err = os.WriteFile(tmp, append(b, '\n'), 0o600); err == nil {
			err = os.Rename(tmp, file)
		}
		if err != nil {
			os.Remove(tmp)
		}
	}
	if err != nil {
		log.Warn("cannot write the serve marker: quro run, exec, term and session on this data directory will not find this server (set QURO_URL)", "file", file, "err", err)
		return func() {}
	}
	return func() {
		if cur, err := readMarkerFile(file); err == nil && cur.PID == m.PID && cur.URL == m.URL {
			os.Remove(file)
		}
	}
}

// localAddr is addr as this machine reaches it: a wildcard address becomes
// the loopback address of its family.
func localAddr(addr net.Addr) string {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return addr.String()
	}
	ip := ta.IP
	switch {
	case ip == nil || ip.Equal(net.IPv4zero):
		ip = net.IPv4(127, 0, 0, 1)
	case ip.Equal(net.IPv6unspecified):
		ip = net.IPv6loopback
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(ta.Port))
}

func readMarkerFile(file string) (*serveMarker, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var m serveMarker
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// liveServer is a server found through the marker of a data directory.
type liveServer struct {
	url  string
	addr netip.AddrPort
}

// findServer returns the server running on dataDir, or nil with the
// reason none is used. Each check that fails means "no server": the
// command then runs in-process, as it does without one.
func findServer(dataDir string) (*liveServer, error) {
	file := filepath.Join(dataDir, ServeMarker)
	fi, err := os.Stat(file)
	if err != nil {
		return nil, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	me := os.Geteuid()
	owner := int(st.Uid)
	if owner != me && me != 0 {
		return nil, fmt.Errorf("%s belongs to uid %d, not to you", file, owner)
	}
	if dfi, err := os.Stat(dataDir); err != nil || int(dfi.Sys().(*syscall.Stat_t).Uid) != owner {
		return nil, fmt.Errorf("%s does not belong to the owner of %s", file, dataDir)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("%s is writable by others (%v)", file, fi.Mode().Perm())
	}
	m, err := readMarkerFile(file)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(m.URL)
	if err != nil || u.Scheme != "http" || u.Path != "" {
		return nil, fmt.Errorf("%s: bad url %q", file, m.URL)
	}
	ap, err := netip.ParseAddrPort(u.Host)
	if err != nil {
		return nil, fmt.Errorf("%s: bad address %q", file, u.Host)
	}
	if m.PID <= 0 {
		return nil, fmt.Errorf("%s: bad pid %d", file, m.PID)
	}
	// The pid is alive and runs as the marker's owner.
	if err := syscall.Kill(m.PID, 0); err == syscall.ESRCH {
		return nil, fmt.Errorf("%s is stale: pid %d is gone", file, m.PID)
	}
	pfi, err := os.Stat(fmt.Sprintf("/proc/%d", m.PID))
	if err != nil {
		return nil, fmt.Errorf("%s is stale: pid %d: %v", file, m.PID, err)
	}
	if int(pfi.Sys().(*syscall.Stat_t).Uid) != owner {
		return nil, fmt.Errorf("%s is stale: pid %d is another user's", file, m.PID)
	}
	// Whoever listens where a connection to the address lands is the
	// marker's owner: not a port another user took after the server died.
	if err := listenedBy(ap, owner); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	return &liveServer{url: m.URL, addr: ap}, nil
}

// listenedBy checks, in /proc/net/tcp and tcp6, that some TCP socket
// listens where a connection to ap lands and that every such socket
// belongs to uid.
func listenedBy(ap netip.AddrPort, uid int) error {
	found := false
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return err
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:tm retrnsmt uid ...
			fs := strings.Fields(sc.Text())
			if len(fs) < 8 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			local, ok := parseProcAddr(fs[1])
			if !ok || local.Port() != ap.Port() {
				continue
			}
			a := local.Addr()
			if !(a.Unmap() == ap.Addr().Unmap() || a.IsUnspecified()) {
				continue
			}
			owner, err := strconv.Atoi(fs[7])
			if err != nil {
				continue
			}
			if owner != uid {
				f.Close()
				return fmt.Errorf("port %d is listened on by uid %d, not by the server's user (uid %d)", ap.Port(), owner, uid)
			}
			found = true
		}
		f.Close()
	}
	if !found {
		return fmt.Errorf("nothing listens on %s: the server is gone", ap)
	}
	return nil
}

// parseProcAddr parses "0100007F:1F90" (IPv4) or the 32-hex-digit IPv6
// form of /proc/net/tcp*: words of 4 bytes printed in host byte order.
func parseProcAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, false
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(a, uint16(port)), true
}
