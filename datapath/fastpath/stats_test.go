package fastpath

import "testing"

// Found by FuzzDecodeFlow: a direction byte other than 0 and 1 showed as
// not learned, while the programs (flow_hit) take any non-zero as learned.
func TestDecodeFlowReadsDirectionsAsTheProgramsDo(t *testing.T) {
	f := decodeFlow(FlowKey{Proto: 6}, FlowVal{Epoch: 4, Egress: 0x30, Ingress: 2}, 4)
	if !f.Egress || !f.Ingress || !f.Live {
		t.Fatalf("egress 0x30, ingress 2 in the live epoch decoded as %+v, want both learned and live", f)
	}
}
