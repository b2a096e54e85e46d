package bpf

import (
	"errors"
	"fmt"
	"io"

	"github.com/cilium/ebpf"
)

// Object is one generated object to load: its bpf2go Load function bound
// to its Objects struct, which closes it.
type Object struct {
	Load func() error
	io.Closer
}

// LoadObjects loads every object, or none: on an error the ones loaded
// are closed again. A verifier error is reported with its full log.
func LoadObjects(what string, objs ...Object) ([]io.Closer, error) {
	var loaded []io.Closer
	for _, o := range objs {
		if err := o.Load(); err != nil {
			for _, c := range loaded {
				c.Close()
			}
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				return nil, fmt.Errorf("load %s: %+v", what, ve)
			}
			return nil, fmt.Errorf("load %s: %w", what, err)
		}
		loaded = append(loaded, o.Closer)
	}
	return loaded, nil
}
