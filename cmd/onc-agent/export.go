package main

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/onc-net/onc/agent/flows"
	"github.com/onc-net/onc/internal/cmdutil"
)

// exportFlags adds the flags of the flow records' export
// (docs/observability.md, "Export") to fs. Their defaults come from the
// environment, which the DaemonSet sets from optional onc-config keys, so
// an onc-config kept from before them still starts the agent. The
// returned check, after parsing, gives the export's config or an error
// naming the flag.
func exportFlags(fs *pflag.FlagSet) (check func(flowsBuffer int) (flows.ExportConfig, error)) {
	file := fs.String("flows-export-file", cmdutil.EnvOr("FLOWS_EXPORT_FILE", ""), `export flow records as JSON lines to this file (an absolute path in a directory only the agent's user may write; rotated at 50 MB, 4 kept), or "-" for stdout (env FLOWS_EXPORT_FILE)`)
	otlp := fs.String("flows-export-otlp", cmdutil.EnvOr("FLOWS_EXPORT_OTLP", ""), "export flow records as OTLP logs over gRPC to this receiver, host:port (env FLOWS_EXPORT_OTLP)")
	ca := fs.String("flows-export-otlp-ca", cmdutil.EnvOr("FLOWS_EXPORT_OTLP_CA", ""), "PEM file of the CAs that sign the OTLP receiver's certificate: the export then uses TLS (default: plaintext) (env FLOWS_EXPORT_OTLP_CA)")
	return func(flowsBuffer int) (flows.ExportConfig, error) {
		c := flows.ExportConfig{File: *file, OTLP: *otlp}
		switch {
		case (c.File != "" || c.OTLP != "") && flowsBuffer == 0:
			return c, errors.New("--flows-export-file and --flows-export-otlp need flow records: --flows-buffer is 0")
		case *ca != "" && c.OTLP == "":
			return c, errors.New("--flows-export-otlp-ca without --flows-export-otlp")
		}
		if c.File != "" {
			if err := flows.CheckExportFile(c.File); err != nil {
				return c, fmt.Errorf("--flows-export-file %q: %w", c.File, err)
			}
		}
		if c.OTLP != "" {
			if err := flows.CheckOTLPEndpoint(c.OTLP); err != nil {
				return c, fmt.Errorf("--flows-export-otlp %q: %w", c.OTLP, err)
			}
		}
		if *ca != "" {
			pool, err := flows.ReadCA(*ca)
			if err != nil {
				return c, fmt.Errorf("--flows-export-otlp-ca: %w", err)
			}
			c.OTLPCA = pool
		}
		return c, nil
	}
}
