package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/rest"
)

// servePprof serves Go's profiler (net/http/pprof) on its own listener at
// addr, which must be a loopback address, to the operator only: profiles
// show the server's code paths, its goroutines' stacks and its command
// line. The main listener never serves it. The returned stop ends it.
func servePprof(addr string, auth httpauth.Func, log *slog.Logger, stdout io.Writer) (stop func(), err error) {
	if err := checkPprofAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof %q: %w", addr, err)
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); !ok || !tcp.IP.IsLoopback() {
		ln.Close()
		return nil, fmt.Errorf("--pprof %q listens on %s, not a loopback address", addr, ln.Addr())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // the index and every named profile (goroutine, heap, ...)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// Loopback Host names only (DNS rebinding) and no foreign page's
	// Origin, as on every route, then the operator's token: stacks and
	// heaps hold every tenant's work.
	h := guard(rest.Access{}, requireOperator(auth, "profiles show every tenant's work", mux))
	// No write timeout: a CPU profile or a trace takes its ?seconds=.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof listener stopped", "err", err)
		}
	}()
	fmt.Fprintf(stdout, "quro profiler on http://%s/debug/pprof/ (the operator's token only)\n", ln.Addr())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close() // a profile still being taken
		}
		<-done
	}, nil
}

// checkPprofAddr accepts a loopback host only: an IP in 127.0.0.0/8 or ::1,
// or a name (localhost) every address of which is loopback.
func checkPprofAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--pprof %q: %v (use 127.0.0.1:6060)", addr, err)
	}
	refuse := fmt.Errorf("--pprof %q is not a loopback address: the profiler shows the server's internals and must not be reachable from other machines; use 127.0.0.1:PORT or [::1]:PORT (and an SSH tunnel to reach it from elsewhere)", addr)
	if host == "" {
		return refuse // every interface
	}
	if ip := net.ParseIP(host); ip != nil {
		if !ip.IsLoopback() {
			return refuse
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(ips) == 0 {
		return fmt.Errorf("--pprof %q: cannot resolve %s (%v); use 127.0.0.1:PORT", addr, host, err)
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return refuse
		}
	}
	return nil
}
