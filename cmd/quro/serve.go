package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/version"
)

func newServeCmd(g *globals) *cobra.Command {
	var (
		addr   string
		patrol time.Duration
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve every capability over HTTP/JSON",
		Long: `Serve the capabilities over HTTP/JSON under /v1/:
  POST /v1/{capability}   e.g. POST /v1/run_code {"code":"print(1)"}
  GET  /v1/capabilities   GET /v1/status   GET /v1/help
This build has no authentication yet, so it listens on loopback only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkLoopback(addr); err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			a, err := app.New(cmd.Context(), g.options(log))
			if err != nil {
				return err
			}
			defer a.Close()
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			// Probe engines and isolation now, not on the first request.
			go a.Status(context.WithoutCancel(cmd.Context()))
			go a.Supervise(cmd.Context(), patrol)
			srv := &http.Server{
				Handler:           rest.New(a.Controller, &rest.Options{Logger: log}),
				ReadHeaderTimeout: 10 * time.Second,
			}
			log.Info("quro serving", "url", "http://"+ln.Addr().String(), "data", a.DataDir, "version", version.String(), "isolation", a.Sandbox.Isolation())
			fmt.Fprintf(cmd.OutOrStdout(), "quro listening on http://%s\n", ln.Addr())
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			select {
			case err := <-errc:
				return err
			case <-cmd.Context().Done():
			}
			log.Info("shutting down")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:7070", "listen address (loopback only in this build)")
	cmd.Flags().DurationVar(&patrol, "patrol", 15*time.Second, "supervisor interval: restart the default shell, stop idle shells, kill orphans")
	return cmd
}

// checkLoopback refuses to listen beyond loopback while there is no
// authentication: anyone who can reach the port could run code.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %v", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--addr %q is not a loopback address: this build has no authentication, so quro serve listens only on 127.0.0.1 or ::1", addr)
	}
	return nil
}
