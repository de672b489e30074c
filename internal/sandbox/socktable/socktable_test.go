package socktable

import (
	"fmt"
	"strings"
	"testing"
)

const tcpHeader = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

func TestParseTCPTable(t *testing.T) {
	t.Parallel()
	table := tcpHeader +
		// 0.0.0.0:8123 LISTEN uid 1234: kept
		"   0: 00000000:1FBB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1234        0 254 1 0 100 0 0 10 0\n" +
		// 127.0.0.1:8888 LISTEN uid 1234: kept
		"   1: 0100007F:22B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1234        0 255 1 0 100 0 0 10 0\n" +
		// 127.0.0.1:53 LISTEN uid 0 (the server's): dropped
		"   2: 0100007F:0035 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 256 1 0 100 0 0 10 0\n" +
		// another uid's listener: dropped
		"   3: 00000000:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1235        0 257 1 0 100 0 0 10 0\n" +
		// an established connection of the uid: dropped
		"   4: 0100007F:D186 0100007F:8423 01 00000000:00000000 03:00000DEA 00000000  1234        0 0 3 0\n"
	var got []string
	if err := Parse([]byte(table), 1234, func(p Listen) { got = append(got, fmt.Sprintf("%s:%d", p.Addr, p.Port)) }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != "0.0.0.0:8123 127.0.0.1:8888" {
		t.Fatalf("got %q", got)
	}
	table6 := "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
		"   0: 00000000000000000000000000000000:0BB8 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1234        0 1 1 0 100 0 0 10 0\n" +
		"   1: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1234        0 2 1 0 100 0 0 10 0\n"
	got = nil
	if err := Parse([]byte(table6), 1234, func(p Listen) { got = append(got, fmt.Sprintf("[%s]:%d", p.Addr, p.Port)) }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != "[::]:3000 [::1]:8080" {
		t.Fatalf("got %q", got)
	}
	for _, bad := range []string{
		"no header\n",
		tcpHeader + "   0: 00000000:1FBB 00000000:0000 0A\n",                                                                        // too few fields
		tcpHeader + "   0: 0000000:1FBB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1234 0 254 1\n",                    // 7 hex digits
		tcpHeader + "   0: 00000000:+FBB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1234 0 254 1\n",                   // a sign
		tcpHeader + "   0: 0000000g:1FBB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1234 0 254 1\n",                   // not hex
		tcpHeader + "   0: 00000000:1FBB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  -1 0 254 1\n",                     // uid
		tcpHeader + "   0: 00000000:1FBB 00000000:0000 A 00000000:00000000 00:00000000 00000000  1234 0 254 1\n",                    // state
		tcpHeader + "   0: 00000000:1FBB" + strings.Repeat(" x", 300) + "\n",                                                        // a long line
		tcpHeader + "   0: 00000000:11FBB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1234 0 254 1\n",                  // port
		tcpHeader + "   0: 00000000:1FBB:1 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1234 0 254 1\n",                 // shape
		tcpHeader + "   0: 0000000000000000000000000000000000:1FBB 00000000:0000 0A 00000000:00000000 00:00000000 00000000 1 0 1\n", // 34 digits
	} {
		if err := Parse([]byte(bad), 1234, func(Listen) {}); err == nil {
			t.Errorf("%q: parsed", bad)
		}
	}
}

// FuzzParseTCPTable: a table of any shape is parsed or refused, never a
// panic, and every port found is a port.
func FuzzParseTCPTable(f *testing.F) {
	f.Add([]byte(tcpHeader + "   0: 00000000:1FBB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1234        0 254 1 0 100 0 0 10 0\n"))
	f.Add([]byte(tcpHeader + "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1234 0 2 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = Parse(b, 1234, func(p Listen) {
			if p.Port < 0 || p.Port > 65535 || !p.Addr.IsValid() {
				t.Fatalf("port %v", p)
			}
		})
	})
}
