package onctl

import (
	"fmt"
	"strings"
	"testing"
)

func TestParseTrace(t *testing.T) {
	for _, tc := range []struct {
		dst, want, err string // want: destination port protocol
	}{
		{dst: "y/web:80", want: "y/web 80 "},
		{dst: "y/web:53/udp", want: "y/web 53 UDP"},
		{dst: "10.96.0.10:53/UDP", want: "10.96.0.10 53 UDP"},
		{dst: "[fd00::a]:443", want: "fd00::a 443 "},
		{dst: "[fd00::a]:443/tcp", want: "fd00::a 443 TCP"},
		{dst: "y/web", err: "a port is needed"},
		{dst: "10.96.0.10", err: "a port is needed"},
		{dst: "fd00::a", err: "a port is needed"},
		{dst: "y/web:http", err: `port "http"`},
		{dst: "y/web:0", err: `port "0"`},
		{dst: "y/web:80/tcp/x", err: "namespace/name or an address"},
		{dst: "web:80", err: "namespace/name or an address"},
	} {
		req, err := parseTrace("x/a", tc.dst)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error with %q", tc.dst, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.dst, err)
		default:
			if got := strings.Join([]string{req.Destination, fmt.Sprint(req.Port), req.Protocol}, " "); got != tc.want || req.Source != "x/a" {
				t.Errorf("%s: %q from %s, want %q", tc.dst, got, req.Source, tc.want)
			}
		}
	}
}
