package app

import (
	"context"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// read_screen by a read-scope caller starts no terminal: with none open it
// answers an empty screen that says so; with one open (the WebSocket's
// OpenPTY) it shows that terminal's screen. (An exec caller's read_screen
// opens the terminal: that is how an agent without a WebSocket gets one.)
func TestReadScreenStartsNothing(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	def, err := a.Sessions.Get(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	reader := controller.Caller{Path: "test", Scope: capability.ScopeRead}
	for range 3 {
		reply, err := callAs(t, a, reader, "read_screen", SessionRef{})
		if err != nil {
			t.Fatal(err)
		}
		scr := reply.Output.(*Screen)
		if scr.Open || scr.Text_ != "" || !strings.Contains(scr.Text(), "no interactive terminal is open") || scr.Cols == 0 {
			t.Fatalf("%+v %q", scr, scr.Text())
		}
	}
	if _, ptys := a.Terminals.Live(); ptys != 0 {
		t.Fatalf("read_screen started %d terminals", ptys)
	}
	if st := a.Terminals.State(def); st.Mode != "none" {
		t.Fatalf("state after read_screen: %+v", st)
	}
	p, err := a.OpenPTY(context.Background(), def.ID)
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("echo SCREEN-$((6*7))\r"))
	for {
		changed := p.ScreenChanged()
		reply, err := callAs(t, a, reader, "read_screen", SessionRef{})
		if err != nil {
			t.Fatal(err)
		}
		scr := reply.Output.(*Screen)
		if !scr.Open {
			t.Fatalf("the open terminal is not shown: %+v", scr)
		}
		if strings.Contains(scr.Text(), "SCREEN-42") {
			break
		}
		<-changed
	}
}
