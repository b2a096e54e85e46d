package peer

import (
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
)

// The sides of a question, in Counts' labels.
const (
	sideAsked    = "asked"
	sideAnswered = "answered"
)

// Counts are the peer API's questions this agent asked and answered, by
// outcome (the gRPC code: OK, or why not), as the metric
// onc_peer_questions_total. A nil *Counts counts nothing.
type Counts struct {
	questions *prometheus.CounterVec
}

// NewCounts is a Counts to register with the agent's metrics.
func NewCounts() *Counts {
	return &Counts{questions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onc_peer_questions_total",
		Help: "Questions of the peer API (onctl trace's other nodes' sides), by side (asked: this agent asked another node; answered: another node asked this one) and code: the gRPC code of the outcome (OK; Unauthenticated: the asker's key is pinned by no node record alone, at the handshake or since; PermissionDenied: a node asked about a source it does not speak for; ResourceExhausted: over the asker's rate; Unavailable: the node could not be reached or its key was refused)."},
		[]string{"side", "code"})}
}

// Describe and Collect make Counts a prometheus.Collector.
func (c *Counts) Describe(ch chan<- *prometheus.Desc) { c.questions.Describe(ch) }

// Collect sends the counters.
func (c *Counts) Collect(ch chan<- prometheus.Metric) { c.questions.Collect(ch) }

// note counts one question of side with its outcome err.
func (c *Counts) note(side string, err error) {
	if c != nil {
		c.questions.WithLabelValues(side, status.Code(err).String()).Inc()
	}
}
