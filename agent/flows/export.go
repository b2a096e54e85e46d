package flows

import (
	"context"
	"crypto/x509"
	"log/slog"
	"sync/atomic"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
)

// Export (docs/observability.md, "Export"): each record the store adds
// goes, as it is added, to each configured destination: a JSON-lines file
// or stdout, and an OTLP/gRPC logs receiver. Records only leave the node,
// nothing comes back in. The export never slows the records: each
// destination has a bounded queue, and what does not fit is lost, counted.

// ExportConfig says where records are exported to.
type ExportConfig struct {
	File   string         // JSON lines: an absolute path (CheckExportFile), or "-" for stdout; "" none
	OTLP   string         // host:port of an OTLP/gRPC logs receiver (CheckOTLPEndpoint); "" none
	OTLPCA *x509.CertPool // TLS to the receiver, verified against these CAs (ReadCA); nil: plaintext
}

// Names of the exporters and the reasons they lose records, the labels
// of onc_flows_exported_total and onc_flows_export_lost_total.
const (
	ExportFile    = "file"
	ExportOTLP    = "otlp"
	LostQueueFull = "queue_full" // the destination fell behind by a full queue
	LostFailed    = "failed"     // the destination failed (retries, if any, ran out) or refused them
)

const (
	exportQueue    = 4096 // records waiting for one destination
	exportBatch    = 512  // records sent at once at most
	exportLinger   = time.Second
	exportShutdown = 5 * time.Second // to send what is queued when the agent stops
)

// destination is where an Exporter sends records.
type destination interface {
	// send delivers recs and says how many arrived; an error says why the
	// others did not.
	send(ctx context.Context, recs []*apiv1.FlowRecord) (int, error)
	close() error
}

// Exporter sends the records a store adds to one destination.
type Exporter struct {
	Name   string // ExportFile or ExportOTLP
	dest   destination
	linger time.Duration // how long a batch waits for more records; 0: it takes what is queued
	queue  chan Record

	exported, queueFull, failed atomic.Uint64
	failing                     bool // the last send failed (Run's)
}

// NewExporters opens the destinations c names and taps store for them;
// Run each one.
func NewExporters(store *Store, c ExportConfig) ([]*Exporter, error) {
	var out []*Exporter
	if c.File != "" {
		d, err := openFileDest(c.File, exportFileMaxMB, exportFileBackups)
		if err != nil {
			return nil, err
		}
		out = append(out, newExporter(ExportFile, d, 0, exportQueue))
	}
	if c.OTLP != "" {
		d, err := dialOTLP(c.OTLP, c.OTLPCA)
		if err != nil {
			return nil, err
		}
		out = append(out, newExporter(ExportOTLP, d, exportLinger, exportQueue))
	}
	for _, e := range out {
		store.Tap(e.offer)
	}
	return out, nil
}

func newExporter(name string, d destination, linger time.Duration, queue int) *Exporter {
	return &Exporter{Name: name, dest: d, linger: linger, queue: make(chan Record, queue)}
}

// offer queues r, or counts it lost if the queue is full.
func (e *Exporter) offer(r *Record) {
	select {
	case e.queue <- *r:
	default:
		e.queueFull.Add(1)
	}
}

// Exported is how many records reached the destination.
func (e *Exporter) Exported() uint64 { return e.exported.Load() }

// Lost is how many records were lost, by reason (LostQueueFull,
// LostFailed).
func (e *Exporter) Lost() map[string]uint64 {
	return map[string]uint64{LostQueueFull: e.queueFull.Load(), LostFailed: e.failed.Load()}
}

// Run sends the queued records in batches until ctx ends, then what is
// still queued, and closes the destination. Sends outlive ctx by
// exportShutdown at most, so that a batch in flight when it ends, and what
// is queued, still go.
func (e *Exporter) Run(ctx context.Context) {
	sendCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(exportShutdown, cancel) })
	defer stop()
	var pending []Record
	for {
		batch := e.next(ctx)
		if ctx.Err() != nil {
			pending = batch
			break
		}
		e.deliver(sendCtx, batch)
	}
	for batch := e.queued(pending); len(batch) > 0; batch = e.queued(nil) {
		e.deliver(sendCtx, batch)
	}
	if err := e.dest.close(); err != nil {
		slog.Warn("flow export: closing", "exporter", e.Name, "err", err)
	}
}

// next waits for a record, then takes more for up to e.linger, at most
// exportBatch; it returns early when ctx ends.
func (e *Exporter) next(ctx context.Context) []Record {
	var batch []Record
	select {
	case <-ctx.Done():
		return nil
	case r := <-e.queue:
		batch = append(batch, r)
	}
	if e.linger == 0 {
		return e.queued(batch)
	}
	linger := time.NewTimer(e.linger)
	defer linger.Stop()
	for len(batch) < exportBatch {
		select {
		case r := <-e.queue:
			batch = append(batch, r)
		case <-linger.C:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

// queued adds to batch what is queued now, up to exportBatch records.
func (e *Exporter) queued(batch []Record) []Record {
	for len(batch) < exportBatch {
		select {
		case r := <-e.queue:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// deliver sends batch, counting what arrived and what was lost, and logs
// when the destination starts failing and when it recovers.
func (e *Exporter) deliver(ctx context.Context, batch []Record) {
	recs := make([]*apiv1.FlowRecord, len(batch))
	for i := range batch {
		recs[i] = toAPI(batch[i])
	}
	sent, err := e.dest.send(ctx, recs)
	e.exported.Add(uint64(sent))
	e.failed.Add(uint64(len(recs) - sent))
	switch {
	case err != nil && !e.failing:
		slog.Warn("flow export failing: records are lost until it recovers (onc_flows_export_lost_total)", "exporter", e.Name,
			"lost", len(recs)-sent, "err", err)
	case err == nil && e.failing:
		slog.Info("flow export recovered", "exporter", e.Name)
	}
	e.failing = err != nil
}
