package flows

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	collogsv1 "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	commonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	logsv1 "go.opentelemetry.io/proto/otlp/logs/v1"
	resourcev1 "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	apiv1 "github.com/onc-net/onc/api/v1"
)

// CheckOTLPEndpoint says whether s is a receiver's host:port.
func CheckOTLPEndpoint(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err == nil && host == "" {
		err = errors.New("no host")
	}
	if p, perr := strconv.ParseUint(port, 10, 16); err == nil && (perr != nil || p == 0) {
		err = fmt.Errorf("port %q is not 1-65535", port)
	}
	if err != nil {
		return fmt.Errorf("want host:port, e.g. otel-collector.monitoring:4317: %w", err)
	}
	return nil
}

// ReadCA reads PEM certificates of CAs from file.
func ReadCA(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// otlpDest sends records as OTLP log records to a receiver's
// LogsService, retrying with backoff while it is unavailable.
type otlpDest struct {
	endpoint string
	conn     *grpc.ClientConn
	client   collogsv1.LogsServiceClient
	attempt  time.Duration    // bounds one Export call
	retryFor time.Duration    // a batch is lost after retrying this long
	backoff  [2]time.Duration // the first wait between tries, and the longest
}

// dialOTLP makes a client for the receiver at endpoint (CheckOTLPEndpoint),
// over TLS verified against ca, or plaintext if ca is nil. It connects at
// the first send, and again whenever the connection breaks.
func dialOTLP(endpoint string, ca *x509.CertPool) (*otlpDest, error) {
	creds := insecure.NewCredentials()
	if ca != nil {
		creds = credentials.NewTLS(&tls.Config{RootCAs: ca, MinVersion: tls.VersionTLS12})
	}
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("OTLP receiver %s: %w", endpoint, err)
	}
	return &otlpDest{endpoint: endpoint, conn: conn, client: collogsv1.NewLogsServiceClient(conn),
		attempt: 10 * time.Second, retryFor: 30 * time.Second, backoff: [2]time.Duration{100 * time.Millisecond, 5 * time.Second}}, nil
}

// retryable are the codes after which OTLP says to send again.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}

func (d *otlpDest) send(ctx context.Context, recs []*apiv1.FlowRecord) (int, error) {
	req := exportRequest(recs)
	wait, giveUp := d.backoff[0], time.Now().Add(d.retryFor)
	for {
		actx, cancel := context.WithTimeout(ctx, d.attempt)
		resp, err := d.client.Export(actx, req)
		cancel()
		if err == nil {
			if ps := resp.GetPartialSuccess(); ps.GetRejectedLogRecords() > 0 {
				return max(0, len(recs)-int(ps.RejectedLogRecords)), fmt.Errorf("OTLP receiver %s rejected %d records: %s", d.endpoint, ps.RejectedLogRecords, ps.ErrorMessage)
			}
			return len(recs), nil
		}
		if !retryable(err) || time.Now().Add(wait).After(giveUp) {
			return 0, fmt.Errorf("OTLP receiver %s: %w", d.endpoint, err)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("OTLP receiver %s: %w", d.endpoint, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, d.backoff[1])
	}
}

func (d *otlpDest) close() error { return d.conn.Close() }

// The OTLP mapping (docs/observability.md, "OTLP"). A record is a log
// record: its time is the timestamp, its summary the body, its node the
// resource's k8s.node.name (beside service.name onc-agent), and each
// other field an attribute: those OpenTelemetry's semantic conventions
// name by that name (semconvNames), every other one as onc.<path of proto
// field names>, so that a field added to FlowRecord is exported without a
// change here. network.transport and network.type are derived besides.
var semconvNames = map[string]string{
	"source.ip":        "source.address",
	"source.port":      "source.port",
	"destination.ip":   "destination.address",
	"destination.port": "destination.port",
}

// FlowRecord's fields that the log record and its resource carry.
const (
	fieldTime = "time_unix_nano"
	fieldNode = "node"
)

// Resource attributes, and the derived log attributes RecordFromOTLP
// skips.
const (
	attrService   = "service.name"
	attrNode      = "k8s.node.name"
	attrTransport = "network.transport"
	attrNetType   = "network.type"
	serviceName   = "onc-agent"
	attrPrefix    = "onc."
)

// exportRequest is recs as OTLP logs, one resource per node.
func exportRequest(recs []*apiv1.FlowRecord) *collogsv1.ExportLogsServiceRequest {
	req := &collogsv1.ExportLogsServiceRequest{}
	byNode := map[string]*logsv1.ScopeLogs{}
	now := uint64(time.Now().UnixNano())
	for _, r := range recs {
		sl := byNode[r.Node]
		if sl == nil {
			sl = &logsv1.ScopeLogs{Scope: &commonv1.InstrumentationScope{Name: "github.com/onc-net/onc/agent/flows"}}
			byNode[r.Node] = sl
			req.ResourceLogs = append(req.ResourceLogs, &logsv1.ResourceLogs{ScopeLogs: []*logsv1.ScopeLogs{sl},
				Resource: &resourcev1.Resource{Attributes: []*commonv1.KeyValue{stringAttr(attrService, serviceName), stringAttr(attrNode, r.Node)}}})
		}
		lr := logRecord(r)
		lr.ObservedTimeUnixNano = now
		sl.LogRecords = append(sl.LogRecords, lr)
	}
	return req
}

// logRecord is r as an OTLP log record, its node aside (the resource's).
func logRecord(r *apiv1.FlowRecord) *logsv1.LogRecord {
	lr := &logsv1.LogRecord{TimeUnixNano: uint64(r.TimeUnixNano), SeverityNumber: logsv1.SeverityNumber_SEVERITY_NUMBER_INFO,
		SeverityText: "INFO", EventName: "onc.flow", Body: &commonv1.AnyValue{Value: &commonv1.AnyValue_StringValue{StringValue: r.Summary()}}}
	lr.Attributes = attributes(nil, "", r.ProtoReflect())
	switch p := strings.ToLower(r.Protocol); p {
	case "tcp", "udp", "sctp":
		lr.Attributes = append(lr.Attributes, stringAttr(attrTransport, p))
	}
	if a, err := netip.ParseAddr(r.Source.GetIp()); err == nil {
		lr.Attributes = append(lr.Attributes, stringAttr(attrNetType, map[bool]string{false: "ipv4", true: "ipv6"}[a.Is6()]))
	}
	return lr
}

func stringAttr(k, v string) *commonv1.KeyValue {
	return &commonv1.KeyValue{Key: k, Value: &commonv1.AnyValue{Value: &commonv1.AnyValue_StringValue{StringValue: v}}}
}

// attributes adds to out the set fields of m, whose path is path, in
// field order; nested messages are flattened.
func attributes(out []*commonv1.KeyValue, path string, m protoreflect.Message) []*commonv1.KeyValue {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		p := string(fd.Name())
		if path != "" {
			p = path + "." + p
		}
		switch {
		case !m.Has(fd), p == fieldTime, p == fieldNode:
		case fd.Message() != nil && fd.Cardinality() != protoreflect.Repeated:
			out = attributes(out, p, m.Get(fd).Message())
		default:
			name, ok := semconvNames[p]
			if !ok {
				name = attrPrefix + p
			}
			out = append(out, &commonv1.KeyValue{Key: name, Value: anyValue(fd, m.Get(fd))})
		}
	}
	return out
}

// anyValue is the value v of field fd: a list as an array, a message (in
// a list) as a list of its set fields by name.
func anyValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) *commonv1.AnyValue {
	if fd.IsList() {
		l := v.List()
		arr := &commonv1.ArrayValue{}
		for i := range l.Len() {
			arr.Values = append(arr.Values, scalarValue(fd, l.Get(i)))
		}
		return &commonv1.AnyValue{Value: &commonv1.AnyValue_ArrayValue{ArrayValue: arr}}
	}
	return scalarValue(fd, v)
}

func scalarValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) *commonv1.AnyValue {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		kvs := &commonv1.KeyValueList{}
		m := v.Message()
		fields := m.Descriptor().Fields()
		for i := range fields.Len() {
			if fd := fields.Get(i); m.Has(fd) {
				kvs.Values = append(kvs.Values, &commonv1.KeyValue{Key: string(fd.Name()), Value: anyValue(fd, m.Get(fd))})
			}
		}
		return &commonv1.AnyValue{Value: &commonv1.AnyValue_KvlistValue{KvlistValue: kvs}}
	case protoreflect.BoolKind:
		return &commonv1.AnyValue{Value: &commonv1.AnyValue_BoolValue{BoolValue: v.Bool()}}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind, protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return &commonv1.AnyValue{Value: &commonv1.AnyValue_IntValue{IntValue: v.Int()}}
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return &commonv1.AnyValue{Value: &commonv1.AnyValue_IntValue{IntValue: int64(v.Uint())}} // OTLP has no unsigned ints
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return &commonv1.AnyValue{Value: &commonv1.AnyValue_DoubleValue{DoubleValue: v.Float()}}
	case protoreflect.BytesKind:
		return &commonv1.AnyValue{Value: &commonv1.AnyValue_BytesValue{BytesValue: v.Bytes()}}
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return &commonv1.AnyValue{Value: &commonv1.AnyValue_StringValue{StringValue: string(ev.Name())}}
		}
		return &commonv1.AnyValue{Value: &commonv1.AnyValue_IntValue{IntValue: int64(v.Enum())}}
	}
	return &commonv1.AnyValue{Value: &commonv1.AnyValue_StringValue{StringValue: v.String()}}
}

// RecordFromOTLP reads a record back from its log record and resource,
// as a consumer of the export would: the tests check with it that every
// field arrives.
func RecordFromOTLP(res *resourcev1.Resource, lr *logsv1.LogRecord) (*apiv1.FlowRecord, error) {
	r := &apiv1.FlowRecord{TimeUnixNano: int64(lr.TimeUnixNano)}
	for _, kv := range res.GetAttributes() {
		if kv.Key == attrNode {
			r.Node = kv.Value.GetStringValue()
		}
	}
	paths := make(map[string]string, len(semconvNames))
	for p, name := range semconvNames {
		paths[name] = p
	}
	for _, kv := range lr.Attributes {
		p, ok := paths[kv.Key]
		switch {
		case ok:
		case strings.HasPrefix(kv.Key, attrPrefix):
			p = strings.TrimPrefix(kv.Key, attrPrefix)
		case kv.Key == attrTransport || kv.Key == attrNetType:
			continue
		default:
			return nil, fmt.Errorf("attribute %s: not of a flow record", kv.Key)
		}
		if err := setField(r.ProtoReflect(), strings.Split(p, "."), kv.Value); err != nil {
			return nil, fmt.Errorf("attribute %s: %w", kv.Key, err)
		}
	}
	return r, nil
}

// setField sets the field of m at path to v.
func setField(m protoreflect.Message, path []string, v *commonv1.AnyValue) error {
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(path[0]))
	switch {
	case fd == nil:
		return fmt.Errorf("%s has no field %s", m.Descriptor().Name(), path[0])
	case len(path) > 1:
		if fd.Message() == nil || fd.IsList() {
			return fmt.Errorf("field %s is not a message", path[0])
		}
		return setField(m.Mutable(fd).Message(), path[1:], v)
	case fd.IsList():
		l := m.Mutable(fd).List()
		for _, e := range v.GetArrayValue().GetValues() {
			ev, err := fieldValue(fd, e, l.NewElement)
			if err != nil {
				return err
			}
			l.Append(ev)
		}
		return nil
	}
	fv, err := fieldValue(fd, v, func() protoreflect.Value { return m.NewField(fd) })
	if err == nil {
		m.Set(fd, fv)
	}
	return err
}

// fieldValue is v as a value of field fd; newMessage makes an empty one
// for a message field.
func fieldValue(fd protoreflect.FieldDescriptor, v *commonv1.AnyValue, newMessage func() protoreflect.Value) (protoreflect.Value, error) {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		mv := newMessage()
		for _, kv := range v.GetKvlistValue().GetValues() {
			if err := setField(mv.Message(), []string{kv.Key}, kv.Value); err != nil {
				return mv, err
			}
		}
		return mv, nil
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(v.GetBoolValue()), nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(v.GetIntValue())), nil
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(v.GetIntValue()), nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(v.GetIntValue())), nil
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(v.GetIntValue())), nil
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(v.GetDoubleValue())), nil
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(v.GetDoubleValue()), nil
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes(v.GetBytesValue()), nil
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByName(protoreflect.Name(v.GetStringValue())); ev != nil {
			return protoreflect.ValueOfEnum(ev.Number()), nil
		}
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(v.GetIntValue())), nil
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(v.GetStringValue()), nil
	}
	return protoreflect.Value{}, fmt.Errorf("field %s: kind %v not exported", fd.Name(), fd.Kind())
}
