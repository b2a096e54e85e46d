// Package cmdutil holds what every ONC daemon's main does the same way:
// logging and shutdown on signals.
package cmdutil

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Setup installs a text logger on stderr and returns a context cancelled on
// SIGINT or SIGTERM.
func Setup(debug bool) (context.Context, context.CancelFunc) {
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// Fatal logs err and exits 1.
func Fatal(msg string, err error) {
	slog.Error(msg, "err", err)
	os.Exit(1)
}

// EnvOr returns the environment variable name, or def if it is empty: flag
// defaults a pod spec can set through its env.
func EnvOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
