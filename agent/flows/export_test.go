package flows

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	collogsv1 "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	commonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	logsv1 "go.opentelemetry.io/proto/otlp/logs/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/internal/testutil"
)

// everyField is a FlowRecord with every field set, found by reflection so
// that a field added to FlowRecord is set too: strings to their path,
// numbers to distinct values, lists to two elements.
func everyField() *apiv1.FlowRecord {
	r := &apiv1.FlowRecord{}
	n := 0
	var fill func(m protoreflect.Message, path string)
	fill = func(m protoreflect.Message, path string) {
		fields := m.Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			p := path + string(fd.Name())
			switch {
			case fd.IsList():
				l := m.Mutable(fd).List()
				for j := range 2 {
					n++
					if fd.Message() != nil {
						e := l.NewElement()
						fill(e.Message(), p+".")
						l.Append(e)
					} else {
						l.Append(valueOf(fd, fmt.Sprintf("%s-%d", p, j), n))
					}
				}
			case fd.Message() != nil:
				fill(m.Mutable(fd).Message(), p+".")
			default:
				n++
				m.Set(fd, valueOf(fd, p, n))
			}
		}
	}
	fill(r.ProtoReflect(), "")
	return r
}

func valueOf(fd protoreflect.FieldDescriptor, s string, n int) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(s)
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(-n))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(n) << 33)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(n))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(n) << 33)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(n) + 0.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(n) + 0.25)
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(s))
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vals.Get(vals.Len() - 1).Number())
	}
	panic(fmt.Sprintf("field %s: kind %v", fd.FullName(), fd.Kind()))
}

// A record with every field set is one line of JSON, and reads back the
// same.
func TestJSONLineRoundTrip(t *testing.T) {
	want := everyField()
	b, err := want.JSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsRune(string(b), '\n') {
		t.Fatalf("not one line: %s", b)
	}
	got := &apiv1.FlowRecord{}
	if err := protojson.Unmarshal(b, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("read back %v\nwant %v", got, want)
	}
}

// Every field of a record reaches its OTLP log record, and reads back the
// same; the names are the semantic conventions' or onc.*.
func TestOTLPEveryField(t *testing.T) {
	want := everyField()
	req := exportRequest([]*apiv1.FlowRecord{want})
	if len(req.ResourceLogs) != 1 || len(req.ResourceLogs[0].ScopeLogs) != 1 || len(req.ResourceLogs[0].ScopeLogs[0].LogRecords) != 1 {
		t.Fatalf("one record: %v", req)
	}
	rl := req.ResourceLogs[0]
	lr := rl.ScopeLogs[0].LogRecords[0]
	for _, kv := range lr.Attributes {
		if !strings.HasPrefix(kv.Key, attrPrefix) && !slices.Contains([]string{"source.address", "source.port", "destination.address", "destination.port"}, kv.Key) {
			t.Errorf("attribute %s: neither a semantic convention's nor onc.*", kv.Key)
		}
	}
	got, err := RecordFromOTLP(rl.Resource, lr)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("read back %v\nwant %v", got, want)
	}
	if _, err := RecordFromOTLP(rl.Resource, &logsv1.LogRecord{Attributes: []*commonv1.KeyValue{stringAttr("onc.nosuch", "x")}}); err == nil ||
		!strings.Contains(err.Error(), "nosuch") {
		t.Errorf("an attribute of no field: %v, want an error naming it", err)
	}
}

// A real record's log record: the names and values a collector sees.
func TestOTLPMapping(t *testing.T) {
	r := toAPI(Record{Time: time.Unix(1700000000, 5), Node: "n1", Event: EventPolicy, Verdict: VerdictDenied, Direction: "ingress", Proto: 6,
		Src:    Endpoint{Kind: KindPod, Namespace: "y", Name: "b", Node: "n2", Addr: netip.MustParseAddrPort("10.1.2.3:40000")},
		Dst:    Endpoint{Kind: KindPod, Namespace: "x", Name: "b", Node: "n1", Addr: netip.MustParseAddrPort("10.1.1.3:80")},
		Reason: "default deny: ingress isolated by x/p", Policies: []string{"x/p", "x/q"}, Path: "slow"})
	req := exportRequest([]*apiv1.FlowRecord{r})
	rl := req.ResourceLogs[0]
	if got := attrString(rl.Resource.Attributes); got != "service.name=onc-agent k8s.node.name=n1" {
		t.Errorf("resource: %s", got)
	}
	lr := rl.ScopeLogs[0].LogRecords[0]
	const want = "onc.event=policy onc.verdict=denied onc.direction=ingress onc.protocol=TCP " +
		"onc.source.kind=pod onc.source.namespace=y onc.source.name=b onc.source.node=n2 source.address=10.1.2.3 source.port=40000 " +
		"onc.destination.kind=pod onc.destination.namespace=x onc.destination.name=b onc.destination.node=n1 destination.address=10.1.1.3 destination.port=80 " +
		"onc.reason=default deny: ingress isolated by x/p onc.policies=[x/p x/q] onc.path=slow network.transport=tcp network.type=ipv4"
	if got := attrString(lr.Attributes); got != want {
		t.Errorf("attributes:\n%s\nwant\n%s", got, want)
	}
	if lr.TimeUnixNano != 1700000000_000000005 || lr.Body.GetStringValue() != r.Summary() || lr.ObservedTimeUnixNano == 0 {
		t.Errorf("time %d, body %q, observed %d; want the record's, its summary %q, now", lr.TimeUnixNano, lr.Body.GetStringValue(), lr.ObservedTimeUnixNano, r.Summary())
	}
}

// A packet the enforcing policies dropped and an audited one would allow
// is exported as denied, with the audit beside: a consumer of denials
// sees it, in the OTLP log record, the JSON line and the summary alike.
func TestAuditedRecordExported(t *testing.T) {
	r := toAPI(Record{Time: time.Unix(1700000000, 5), Node: "n1", Event: EventPolicy, Verdict: VerdictDenied, Audit: AuditWouldAllow, Direction: "ingress", Proto: 6,
		Src: Endpoint{Kind: KindIP, Addr: netip.MustParseAddrPort("10.1.2.3:40000")}, Dst: Endpoint{Kind: KindIP, Addr: netip.MustParseAddrPort("10.1.1.3:80")}})
	lr := exportRequest([]*apiv1.FlowRecord{r}).ResourceLogs[0].ScopeLogs[0].LogRecords[0]
	if got := attrString(lr.Attributes); !strings.Contains(got, "onc.verdict=denied ") || !strings.Contains(got, "onc.audit=would-allow") {
		t.Errorf("attributes: %s; want verdict denied, audit would-allow", got)
	}
	b, err := r.JSON()
	if err != nil || !strings.Contains(string(b), `"verdict":"denied"`) || !strings.Contains(string(b), `"audit":"would-allow"`) {
		t.Errorf("JSON line %s, %v; want verdict denied, audit would-allow", b, err)
	}
	if got, want := r.Summary(), "n1 DENIED (audit: would-allow) ingress TCP 10.1.2.3:40000 → 10.1.1.3:80"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}

// Rule 0, the first rule of a policy, is sent in the JSON line and the
// OTLP log record; a record without a deciding rule has no rule in either.
func TestRuleZeroSent(t *testing.T) {
	for _, c := range []struct {
		rule     *int
		otlpAttr string // "": none
	}{
		{ruleIndex(0), "onc.rule=0"},
		{nil, ""},
	} {
		r := toAPI(Record{Time: time.Unix(1700000000, 0), Node: "n1", Event: EventPolicy, Verdict: VerdictAllowed, Direction: "ingress", Proto: 6,
			Policies: []string{"x/p"}, Rule: c.rule, Path: "slow"})
		b, err := r.JSON()
		if err != nil {
			t.Fatal(err)
		}
		var fields map[string]any // protojson's spacing varies: compare values
		if err := json.Unmarshal(b, &fields); err != nil {
			t.Fatal(err)
		}
		if got, has := fields["rule"]; has != (c.rule != nil) || has && got != float64(*c.rule) {
			t.Errorf("rule %s: JSON %s, want rule %s", ruleString(c.rule), b, ruleString(c.rule))
		}
		rl := exportRequest([]*apiv1.FlowRecord{r}).ResourceLogs[0]
		attrs := " " + attrString(rl.ScopeLogs[0].LogRecords[0].Attributes) + " "
		if has := strings.Contains(attrs, " onc.rule="); has != (c.otlpAttr != "") || has && !strings.Contains(attrs, " "+c.otlpAttr+" ") {
			t.Errorf("rule %s: OTLP attributes%s, want %q in them (none: no onc.rule)", ruleString(c.rule), attrs, c.otlpAttr)
		}
		back, err := RecordFromOTLP(rl.Resource, rl.ScopeLogs[0].LogRecords[0])
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(back, r) {
			t.Errorf("rule %s: read back from OTLP %v, want %v", ruleString(c.rule), back, r)
		}
	}
}

func attrString(kvs []*commonv1.KeyValue) string {
	var out []string
	for _, kv := range kvs {
		v := kv.Value.GetStringValue()
		switch x := kv.Value.Value.(type) {
		case *commonv1.AnyValue_IntValue:
			v = fmt.Sprint(x.IntValue)
		case *commonv1.AnyValue_ArrayValue:
			var vs []string
			for _, e := range x.ArrayValue.Values {
				vs = append(vs, e.GetStringValue())
			}
			v = fmt.Sprint(vs)
		}
		out = append(out, kv.Key+"="+v)
	}
	return strings.Join(out, " ")
}

// fakeCollector is an OTLP logs receiver that answers the next calls
// with fail's errors, in turn, then takes the records.
type fakeCollector struct {
	collogsv1.UnimplementedLogsServiceServer
	mu     sync.Mutex
	fail   []error
	reject int64         // records each call reports rejecting
	hold   chan struct{} // if set, calls wait until it is closed
	calls  int
	got    []*apiv1.FlowRecord
}

func (f *fakeCollector) Export(ctx context.Context, req *collogsv1.ExportLogsServiceRequest) (*collogsv1.ExportLogsServiceResponse, error) {
	f.mu.Lock()
	f.calls++
	hold := f.hold
	f.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.fail) > 0 {
		err := f.fail[0]
		f.fail = f.fail[1:]
		return nil, err
	}
	for _, rl := range req.ResourceLogs {
		for _, sl := range rl.ScopeLogs {
			for _, lr := range sl.LogRecords {
				r, err := RecordFromOTLP(rl.Resource, lr)
				if err != nil {
					return nil, status.Error(codes.InvalidArgument, err.Error())
				}
				f.got = append(f.got, r)
			}
		}
	}
	if f.reject > 0 {
		return &collogsv1.ExportLogsServiceResponse{PartialSuccess: &collogsv1.ExportLogsPartialSuccess{RejectedLogRecords: f.reject, ErrorMessage: "too old"}}, nil
	}
	return &collogsv1.ExportLogsServiceResponse{}, nil
}

func (f *fakeCollector) received() (calls int, got []*apiv1.FlowRecord) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, slices.Clone(f.got)
}

// serve starts f on a loopback port, with TLS if cert is set.
func (f *fakeCollector) serve(t *testing.T, cert *tls.Certificate) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if cert != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{*cert}})))
	}
	srv := grpc.NewServer(opts...)
	collogsv1.RegisterLogsServiceServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return l.Addr().String()
}

// otlpExporter exports store's records to addr, retrying quickly.
func otlpExporter(t *testing.T, store *Store, addr string, ca *x509.CertPool, queue int) *Exporter {
	d, err := dialOTLP(addr, ca)
	if err != nil {
		t.Fatal(err)
	}
	d.backoff, d.retryFor = [2]time.Duration{10 * time.Millisecond, 40 * time.Millisecond}, time.Second
	e := newExporter(ExportOTLP, d, 20*time.Millisecond, queue)
	store.Tap(e.offer)
	return e
}

// run runs e until the test ends (or stop is called), waiting for it.
func run(t *testing.T, e *Exporter) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

func waitExported(t *testing.T, e *Exporter, n uint64) {
	testutil.WaitFor(t, fmt.Sprintf("%d records exported", n), 5*time.Second, func() bool { return e.Exported() >= n })
}

// While the receiver is unavailable, the exporter retries the batch; it
// arrives whole once the receiver is back.
func TestOTLPRetriesUnavailable(t *testing.T) {
	f := &fakeCollector{fail: []error{status.Error(codes.Unavailable, "restarting"), status.Error(codes.Unavailable, "restarting")}}
	store := NewStore(16)
	e := otlpExporter(t, store, f.serve(t, nil), nil, 16)
	run(t, e)
	for i := range 3 {
		store.Add(rec(i, "x"))
	}
	waitExported(t, e, 3)
	calls, got := f.received()
	if calls != 3 || len(got) != 3 || got[2].Source.Name != "p2" || e.Lost()[LostFailed] != 0 {
		t.Fatalf("%d calls, %d records (%v), lost %v; want 2 refused calls, then 3 records in one, none lost", calls, len(got), got, e.Lost())
	}
}

// A refusal that retrying cannot help, or a receiver unavailable longer
// than the retries, loses the batch, counted; the next batch goes.
func TestOTLPLosesFailedBatch(t *testing.T) {
	for _, fail := range [][]error{
		{status.Error(codes.InvalidArgument, "no")},
		slices.Repeat([]error{status.Error(codes.Unavailable, "down")}, 1000),
	} {
		f := &fakeCollector{fail: fail}
		store := NewStore(16)
		e := otlpExporter(t, store, f.serve(t, nil), nil, 16)
		e.dest.(*otlpDest).retryFor = 100 * time.Millisecond
		stop := run(t, e)
		store.Add(rec(0, "x"))
		testutil.WaitFor(t, "the batch lost", 5*time.Second, func() bool { return e.Lost()[LostFailed] == 1 })
		calls, _ := f.received()
		if c := status.Code(fail[0]); c == codes.InvalidArgument && calls != 1 || c == codes.Unavailable && calls < 3 {
			t.Errorf("%v: %d calls; want 1 for a refusal, several for Unavailable", c, calls)
		}
		f.mu.Lock()
		f.fail = nil
		f.mu.Unlock()
		store.Add(rec(1, "x"))
		waitExported(t, e, 1)
		stop()
	}
}

// Records the receiver reports rejecting are lost, counted; the others
// arrived.
func TestOTLPPartialSuccess(t *testing.T) {
	f := &fakeCollector{reject: 1}
	store := NewStore(16)
	e := otlpExporter(t, store, f.serve(t, nil), nil, 16)
	e.linger = time.Hour // one batch, sent at stop
	stop := run(t, e)
	for i := range 3 {
		store.Add(rec(i, "x"))
	}
	stop()
	if calls, _ := f.received(); calls != 1 || e.Exported() != 2 || e.Lost()[LostFailed] != 1 {
		t.Fatalf("%d calls, %d exported, lost %v; want 1 call, 2 exported, 1 failed", calls, e.Exported(), e.Lost())
	}
}

// A destination that falls behind by a full queue loses the records that
// do not fit, counted, and never holds up the store.
func TestExportQueueFull(t *testing.T) {
	f := &fakeCollector{}
	store := NewStore(16)
	e := otlpExporter(t, store, f.serve(t, nil), nil, 2)
	done := make(chan struct{})
	go func() {
		for i := range 5 {
			store.Add(rec(i, "x")) // nothing reads the queue yet
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the store waited for the exporter")
	}
	if lost := e.Lost()[LostQueueFull]; lost != 3 {
		t.Fatalf("lost %d to a full queue, want 3 of 5 (queue of 2)", lost)
	}
	run(t, e)
	waitExported(t, e, 2)
	if _, got := f.received(); len(got) != 2 || got[0].Source.Name != "p0" || got[1].Source.Name != "p1" {
		t.Fatalf("received %v, want the 2 queued, p0 and p1", got)
	}
}

// Stopping sends the batch in flight and what is queued, without waiting
// for a batch to fill.
func TestExportShutdownFlushes(t *testing.T) {
	f := &fakeCollector{hold: make(chan struct{})}
	store := NewStore(2048)
	e := otlpExporter(t, store, f.serve(t, nil), nil, 2048)
	e.linger = time.Hour
	stop := run(t, e)
	const n = 2*exportBatch + 100 // a batch in flight, one queued, and part of one
	for i := range n {
		store.Add(rec(i, "x"))
	}
	testutil.WaitFor(t, "a batch in flight", 5*time.Second, func() bool { calls, _ := f.received(); return calls == 1 })
	start := time.Now()
	time.AfterFunc(100*time.Millisecond, func() { close(f.hold) }) // the receiver answers after the stop
	stop()
	if took := time.Since(start); took > exportShutdown {
		t.Errorf("stopping took %v", took)
	}
	if _, got := f.received(); len(got) != n || e.Exported() != n {
		t.Fatalf("received %d, exported %d after stopping; want %d", len(got), e.Exported(), n)
	}
}

// With a CA, the exporter speaks TLS and sends only to a receiver whose
// certificate that CA signed.
func TestOTLPTLS(t *testing.T) {
	dir := t.TempDir()
	caPool, caFile, cert := testCA(t, dir, "ca")
	otherPool, _, _ := testCA(t, dir, "other")
	if _, err := ReadCA(caFile); err != nil {
		t.Fatal(err)
	}
	f := &fakeCollector{}
	addr := f.serve(t, cert)
	store := NewStore(16)
	good := otlpExporter(t, store, addr, caPool, 16)
	bad := otlpExporter(t, store, addr, otherPool, 16)
	plain := otlpExporter(t, store, addr, nil, 16)
	for _, e := range []*Exporter{good, bad, plain} {
		run(t, e)
	}
	store.Add(rec(0, "x"))
	waitExported(t, good, 1)
	testutil.WaitFor(t, "the exporters without the right CA give up", 5*time.Second, func() bool {
		return bad.Lost()[LostFailed] == 1 && plain.Lost()[LostFailed] == 1
	})
	if _, got := f.received(); len(got) != 1 || bad.Exported()+plain.Exported() != 0 {
		t.Fatalf("received %d records; want 1, from the exporter with the right CA", len(got))
	}
}

// testCA makes a CA (its pool and PEM file) and a certificate it signed
// for 127.0.0.1.
func testCA(t *testing.T, dir, name string) (*x509.CertPool, string, *tls.Certificate) {
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, leafKey := key(), key()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "collector"}, NotBefore: tmpl.NotBefore,
		NotAfter: tmpl.NotAfter, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, name+".pem")
	testutil.Must(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600))
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool, file, &tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}
}

func TestCheckOTLPEndpoint(t *testing.T) {
	for _, good := range []string{"collector.monitoring:4317", "10.0.0.1:4317", "[fd00::1]:4317"} {
		if err := CheckOTLPEndpoint(good); err != nil {
			t.Errorf("%s: %v", good, err)
		}
	}
	for _, bad := range []string{"", "collector", ":4317", "collector:0", "collector:65536", "collector:otlp", "http://collector:4317"} {
		if err := CheckOTLPEndpoint(bad); err == nil || !strings.Contains(err.Error(), "host:port") {
			t.Errorf("%q: %v, want an error asking for host:port", bad, err)
		}
	}
	dir := t.TempDir()
	testutil.Must(t, os.WriteFile(filepath.Join(dir, "junk"), []byte("not a certificate"), 0o600))
	for _, bad := range []string{filepath.Join(dir, "none"), filepath.Join(dir, "junk")} {
		if _, err := ReadCA(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("CA file %s: %v, want an error naming it", bad, err)
		}
	}
}

// The JSON-lines file: the store's records as onctl flows -o json prints
// them, in a new file only this user can read; the checks refuse a file
// others could swap.
func TestExportFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "onc")
	path := filepath.Join(dir, "flows.jsonl")
	testutil.Must(t, CheckExportFile(path))
	for p, mode := range map[string]os.FileMode{dir: 0o750, path: 0o600} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want mode %v", p, fi.Mode(), err, mode)
		}
	}
	store := NewStore(16)
	es, err := NewExporters(store, ExportConfig{File: path})
	if err != nil || len(es) != 1 || es[0].Name != ExportFile {
		t.Fatalf("exporters %v, %v; want the file's", es, err)
	}
	stop := run(t, es[0])
	want := []Record{rec(0, "x"), rec(1, "y")}
	for _, r := range want {
		store.Add(r)
	}
	waitExported(t, es[0], 2)
	stop()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		lines = append(lines, sc.Text())
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d: %q", len(lines), len(want), lines)
	}
	for i, line := range lines {
		if b, _ := toAPI(want[i]).JSON(); line != string(b) {
			t.Errorf("line %d: %s\nwant (as onctl flows -o json): %s", i, line, b)
		}
	}

	// Refused, each with an error naming the path at fault: a directory
	// on the way that is a symlink, or that group or others may write
	// (even with the sticky bit, as the file's own directory), and a
	// symlink or a FIFO as the file.
	base := t.TempDir()
	open, groupW, real := filepath.Join(base, "open"), filepath.Join(base, "group"), filepath.Join(base, "real")
	for _, d := range []string{open, groupW, real} {
		testutil.Must(t, os.Mkdir(d, 0o750))
	}
	testutil.Must(t, os.Chmod(open, 0o777))
	testutil.Must(t, os.Chmod(groupW, 0o770))
	testutil.Must(t, os.Symlink(real, filepath.Join(base, "linkdir")))
	testutil.Must(t, os.Symlink("/etc/passwd", filepath.Join(dir, "link")))
	testutil.Must(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	for _, c := range []struct{ path, fault, why string }{
		{"flows.jsonl", "", "not an absolute path"},
		{filepath.Join(open, "flows.jsonl"), open, "writable by group or others"},
		{filepath.Join(groupW, "sub", "flows.jsonl"), groupW, "writable by group or others"},
		{filepath.Join(base, "linkdir", "flows.jsonl"), filepath.Join(base, "linkdir"), "not a directory"},
		{filepath.Join(base, "linkdir", "sub", "flows.jsonl"), filepath.Join(base, "linkdir"), "not a directory"},
		{filepath.Join(dir, "link"), filepath.Join(dir, "link"), "a symlink"},
		{filepath.Join(dir, "fifo"), filepath.Join(dir, "fifo"), "not a regular file"},
		{"/tmp/onc-flows-test.jsonl", "/tmp", "writable by group or others"}, // root's, sticky, yet the file's own
	} {
		err := CheckExportFile(c.path)
		if err == nil || !strings.Contains(err.Error(), c.fault+":") && !strings.Contains(err.Error(), c.fault+" (") || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: %v, want refused naming %s: %s", c.path, err, c.fault, c.why)
		}
	}
	if _, err := os.Stat(filepath.Join(real, "sub")); err == nil {
		t.Errorf("a directory was created through the symlink %s", filepath.Join(base, "linkdir"))
	}
}

// The file is rotated by size and the rotated files kept are bounded.
func TestExportFileRotation(t *testing.T) {
	dir := t.TempDir()
	d, err := openFileDest(filepath.Join(dir, "flows.jsonl"), 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	r := toAPI(rec(0, "x"))
	r.Reason = strings.Repeat("r", 1000)
	batch := slices.Repeat([]*apiv1.FlowRecord{r}, 100) // ≈ 110 KB
	for range 50 {                                      // ≈ 5.5 MB
		if n, err := d.send(context.Background(), batch); err != nil || n != len(batch) {
			t.Fatalf("sent %d: %v", n, err)
		}
	}
	testutil.WaitFor(t, "at most the file and 2 rotated ones", 5*time.Second, func() bool {
		es, _ := os.ReadDir(dir)
		return len(es) == 3
	})
	es, _ := os.ReadDir(dir)
	for _, e := range es {
		fi, _ := e.Info()
		if fi.Size() > 1<<20 || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %d bytes, mode %v; want at most 1 MiB, 0600", e.Name(), fi.Size(), fi.Mode().Perm())
		}
	}
}
