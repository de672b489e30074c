package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/creack/pty"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// detachKey ends quro term (Ctrl-]).
const detachKey = 0x1d

func newTermCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "term [SESSION]",
		Short: "Open an interactive terminal (PTY) in a session; Ctrl-] detaches",
		Long: `Open an interactive shell on a pseudo-terminal in the session's sandbox and
attach your terminal to it. Ctrl-] detaches and ends it (this command runs
the terminal in-process).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in, ok := g.stdin.(*os.File)
			if !ok || !term.IsTerminal(int(in.Fd())) {
				return errors.New("quro term needs a terminal on standard input")
			}
			a, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer a.Close()
			s, err := a.Sessions.Get(cmd.Context(), first(args))
			if err != nil {
				return err
			}
			p, err := a.Terminals.PTY(s)
			if err != nil {
				return err
			}
			if size, err := pty.GetsizeFull(in); err == nil {
				p.Resize(int(size.Cols), int(size.Rows))
			}
			old, err := term.MakeRaw(int(in.Fd()))
			if err != nil {
				return err
			}
			defer term.Restore(int(in.Fd()), old)
			fmt.Fprintf(cmd.ErrOrStderr(), "[quro: session %s; Ctrl-] detaches]\r\n", s.Name)

			winch := make(chan os.Signal, 1)
			signal.Notify(winch, syscall.SIGWINCH)
			defer signal.Stop(winch)
			v, replay := p.Attach()
			defer p.Detach(v)
			out := cmd.OutOrStdout()
			out.Write(replay)
			keys := make(chan []byte)
			go func() {
				buf := make([]byte, 4096)
				for {
					n, err := in.Read(buf)
					if err != nil {
						close(keys)
						return
					}
					keys <- append([]byte(nil), buf[:n]...)
				}
			}()
			for {
				select {
				case b, ok := <-v.C:
					if !ok {
						return nil
					}
					out.Write(b)
				case k, ok := <-keys:
					if !ok {
						return nil
					}
					for i, c := range k {
						if c == detachKey {
							p.Write(k[:i])
							return nil
						}
					}
					p.Write(k)
				case <-winch:
					if size, err := pty.GetsizeFull(in); err == nil {
						p.Resize(int(size.Cols), int(size.Rows))
					}
				case <-p.Done():
					return nil
				case <-cmd.Context().Done():
					return nil
				}
			}
		},
	}
}
