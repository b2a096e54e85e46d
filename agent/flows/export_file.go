package flows

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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

// CheckExportFile says whether records may be written to path: "-"
// (stdout), or an absolute path no one but root and this agent's user can
// swap or redirect. Every directory from / down to the file's must be a
// real directory (not a symlink), owned by root or this agent's user, and
// writable by no one else; the one exception is a root-owned sticky
// directory such as /tmp above the file's own directory, where others may
// add entries but not rename or remove ours, and the next directory down
// must pass these checks itself. Missing directories are created 0750. The
// file must be a regular file, not a symlink; it is created 0600 if
// missing, and an existing one keeps its mode (0640, say, for a log
// shipper's group).
func CheckExportFile(path string) error {
	if path == "-" {
		return nil
	}
	if !filepath.IsAbs(path) {
		return errors.New("not an absolute path (or - for stdout)")
	}
	path = filepath.Clean(path)
	dir := filepath.Dir(path)
	for _, d := range ancestors(dir) {
		if err := checkExportDir(d, d == dir); err != nil {
			return err
		}
	}
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %s, not a regular file", path, fileKind(fi))
	}
	// O_NOFOLLOW as well: no one else can plant a link in the checked
	// directory, but the agent is not to write through one either.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

func fileKind(fi fs.FileInfo) string {
	if fi.Mode()&fs.ModeSymlink != 0 {
		return "a symlink"
	}
	return fmt.Sprintf("of type %v", fi.Mode().Type())
}

// ancestors is dir and every directory above it, from / down.
func ancestors(dir string) []string {
	var out []string
	for d := dir; ; d = filepath.Dir(d) {
		out = append(out, d)
		if d == "/" {
			break
		}
	}
	slices.Reverse(out)
	return out
}

// checkExportDir checks (creating it 0750 if missing) one directory on
// the way to the export file, last true for the file's own.
func checkExportDir(dir string, last bool) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(dir, 0o750); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		fi, err = os.Lstat(dir)
	}
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 || !fi.IsDir() {
		return fmt.Errorf("%s: %s, not a directory: every directory above the export file must be a real one", dir, fileKind(fi))
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner", dir)
	}
	uid := int(st.Uid)
	if uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("%s: owned by uid %d, want root or this agent's user (uid %d)", dir, uid, os.Geteuid())
	}
	sharedSticky := uid == 0 && fi.Mode()&fs.ModeSticky != 0 && !last
	if fi.Mode().Perm()&0o022 != 0 && !sharedSticky {
		return fmt.Errorf("%s (mode %v): writable by group or others, who could swap the export file", dir, fi.Mode().Perm())
	}
	return nil
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
