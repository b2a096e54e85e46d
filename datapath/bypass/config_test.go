package bypass

import "testing"

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		mode string
		min  uint32
		want string
		err  bool
	}{
		{"on", 0, "on", false},
		{"off", 0, "off", false},
		{"size", 512, "size ≥ 512 B", false},
		{"size", 0, "", true},
		{"fast", 0, "", true},
	} {
		c, err := ParseConfig(tc.mode, tc.min)
		if (err != nil) != tc.err || (err == nil && c.String() != tc.want) {
			t.Errorf("ParseConfig(%q, %d) = %v, %v", tc.mode, tc.min, c, err)
		}
	}
}
