package app

import (
	"context"
	"strings"
	"testing"
)

// read_screen is a read: it starts no terminal. With none open it answers
// an empty screen that says so; with one open (the WebSocket's OpenPTY) it
// shows that terminal's screen.
func TestReadScreenStartsNothing(t *testing.T) {
	a := newApp(t, nil)
	def, err := a.Sessions.Get(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		reply, err := call(t, a, "read_screen", SessionRef{})
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
		scr := mustCall(t, a, "read_screen", SessionRef{}).(*Screen)
		if !scr.Open {
			t.Fatalf("the open terminal is not shown: %+v", scr)
		}
		if strings.Contains(scr.Text(), "SCREEN-42") {
			break
		}
		<-changed
	}
}
