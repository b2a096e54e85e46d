// Package metrics serves a daemon's Prometheus metrics (docs/metrics.md):
// a registry of its own, not client_golang's global one that any imported
// library may fill, with the Go runtime and process collectors, served on
// /metrics beside /healthz.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry returns a registry holding the Go runtime and process
// collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// NewScrapeErrors is onc_scrape_errors_total, by source: reads at scrape
// time that failed, leaving that source's metrics out of the scrape. Each
// of sources starts at 0, so a rate() is 0, not nothing, until one fails.
// A collector that reads collects it last, after counting its failures.
func NewScrapeErrors(sources ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onc_scrape_errors_total",
		Help: "Reads at scrape time that failed, by source; that scrape left the source's metrics out."},
		[]string{"source"})
	for _, s := range sources {
		c.WithLabelValues(s)
	}
	return c
}

// Serve listens on addr and serves reg on /metrics, and 200 on /healthz,
// until ctx ends. It returns the address it listens on: addr's host and
// the port bound, so ":0" says which port it got.
func Serve(ctx context.Context, addr string, reg *prometheus.Registry) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("serve metrics: %w", err)
	}
	mux := http.NewServeMux()
	// A collector that fails is logged and left out; the rest is served.
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: logger{}, ErrorHandling: promhttp.ContinueOnError, Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			slog.Error("metrics server stopped", "addr", l.Addr(), "err", err)
		}
	}()
	host, _, _ := net.SplitHostPort(addr) // Listen accepted it
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return net.JoinHostPort(host, port), nil
}

// logger is promhttp's error log on slog.
type logger struct{}

func (logger) Println(v ...any) { slog.Warn("metrics: " + fmt.Sprint(v...)) }
