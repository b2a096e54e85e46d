// Package docs holds no code: its test keeps the code map in
// architecture.md true to the module's packages.
package docs

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The code map names every Go package of the module, and every folder it
// names exists: a newcomer finds each package there, and nothing that
// was moved or removed.
func TestCodeMap(t *testing.T) {
	listed := codeMap(t, "architecture.md")
	for _, pkg := range packages(t, "..") {
		if !listed[pkg] {
			t.Errorf("package %s is not in architecture.md's code map", pkg)
		}
	}
	for dir := range listed {
		if fi, err := os.Stat(filepath.Join("..", dir)); err != nil || !fi.IsDir() {
			t.Errorf("architecture.md's code map lists %s, which is no folder of the module", dir)
		}
	}
}

var quoted = regexp.MustCompile("`([^`]+)`")

// codeMap is the set of folders the first column of the code map's table
// names (each in backquotes, a trailing slash or not).
func codeMap(t *testing.T, doc string) map[string]bool {
	t.Helper()
	f, err := os.Open(doc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	listed := map[string]bool{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "## Code map":
			in = true
		case in && strings.HasPrefix(line, "#"):
			in = false
		case in && strings.HasPrefix(line, "| `"):
			first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " |")
			for _, m := range quoted.FindAllStringSubmatch(first, -1) {
				listed[strings.TrimSuffix(m[1], "/")] = true
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(listed) == 0 {
		t.Fatalf("%s has no code map (a table under \"## Code map\" whose rows start with a folder in backquotes)", doc)
	}
	return listed
}

// packages are the folders under root holding .go files, outside
// testdata, hidden folders and nested modules, relative to root.
func packages(t *testing.T, root string) []string {
	t.Helper()
	set := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			set[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var pkgs []string
	for p := range set {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	return pkgs
}
