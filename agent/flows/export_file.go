package flows

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"gopkg.in/natefinch/lumberjack.v2"

	apiv1 "github.com/onc-net/onc/api/v1"
)

// The JSON-lines file is rotated at exportFileMaxMB and keeps
// exportFileBackups rotated files beside it: at most 250 MiB in all.
const (
	exportFileMaxMB   = 50
	exportFileBackups = 4
)

// CheckExportFile says whether records may be written to path: "-" (stdout),
// or an absolute path in a directory this process's user owns and no one
// else may write to (created 0750 if missing), so no one else can swap the
// file or plant a link in its place. It creates the file (0600) if missing;
// an existing one keeps its mode (0640, say, for a log shipper's group).
func CheckExportFile(path string) error {
	if path == "-" {
		return nil
	}
	if !filepath.IsAbs(path) {
		return errors.New("not an absolute path (or - for stdout)")
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("directory %s (mode %v) must be owned by this agent's user (uid %d) and writable by no one else", dir, fi.Mode().Perm(), os.Geteuid())
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// fileDest writes each record as a line of JSON (FlowRecord.JSON, as onctl
// flows -o json prints it).
type fileDest struct {
	w io.WriteCloser
}

// openFileDest writes to stdout for "-", else to path, rotated at maxMB
// megabytes, with backups rotated files kept. CheckExportFile has checked
// path.
func openFileDest(path string, maxMB, backups int) (*fileDest, error) {
	if path == "-" {
		return &fileDest{w: nopCloser{os.Stdout}}, nil
	}
	return &fileDest{w: &lumberjack.Logger{Filename: path, MaxSize: maxMB, MaxBackups: backups}}, nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// send writes recs in one write, so a reader of the file sees whole lines.
func (d *fileDest) send(_ context.Context, recs []*apiv1.FlowRecord) (int, error) {
	var buf []byte
	for _, r := range recs {
		b, err := r.JSON()
		if err != nil {
			return 0, err
		}
		buf = append(append(buf, b...), '\n')
	}
	if _, err := d.w.Write(buf); err != nil {
		return 0, err
	}
	return len(recs), nil
}

func (d *fileDest) close() error { return d.w.Close() }
