package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"sigs.k8s.io/knftables"
)

// runBatched runs tx as one nft transaction, as knftables would, but for
// how it reaches nft: knftables writes one command per set element, and
// nft parses and sends each on its own. A change that adds 1,000 elements
// to each of 44 pods' sets took nft 700 ms as 44,000 commands and 272 ms
// as 44 (docs/performance.md), so each run of element commands on one
// set goes as one command, of at most maxBatch elements. Its error is
// nft's exit and message, not knftables' (knftables.IsNotFound cannot
// read it).
func runBatched(ctx context.Context, nft string, tx *knftables.Transaction) error {
	text := tx.String()
	// knftables ends a transaction it refused an operation of with the
	// error, as a comment nft would skip, after the last command's
	// newline: that transaction must not run.
	if last := text[strings.LastIndexByte(text, '\n')+1:]; strings.HasPrefix(last, "# ERROR: ") {
		return errors.New(strings.TrimPrefix(last, "# ERROR: "))
	}
	cmd := exec.CommandContext(ctx, nft, "-f", "-")
	cmd.Stdin = strings.NewReader(batchElements(text, maxBatch))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w: %s", err, shortLines(stderr.String(), 300))
	}
	return nil
}

// shortLines is s, trimmed, with each line cut to max bytes: nft quotes
// the command it fails on, and a batched one holds up to maxBatch
// elements; its message and the element it names come first.
func shortLines(s string, max int) string {
	var out []string
	for line := range strings.Lines(strings.TrimSpace(s)) {
		line = strings.TrimSuffix(line, "\n")
		if len(line) > max {
			line = line[:max] + " …"
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// maxBatch bounds the elements of one command: nft reads a command as one
// line, and a table rewrite holds sets of 100,000 elements and more.
const maxBatch = 1000

// batchElements rewrites the commands of text (knftables' transaction,
// one command a line) so that consecutive commands adding, or deleting,
// elements of the same set or map become one, of at most max elements:
// "add element inet t s { a }" and "add element inet t s { b }" are
// "add element inet t s { a, b }". The order of everything else, and of
// the elements, is kept.
func batchElements(text string, max int) string {
	var out strings.Builder
	out.Grow(len(text))
	head, n := "", 0 // the open command's "<verb> element <family> <table> <set> { ", and its elements
	closeCmd := func() {
		if n > 0 {
			out.WriteString(" }\n")
		}
		head, n = "", 0
	}
	for line := range strings.Lines(text) {
		line = strings.TrimSuffix(line, "\n")
		h, elem, ok := elementCommand(line)
		if !ok {
			closeCmd()
			out.WriteString(line)
			out.WriteByte('\n')
			continue
		}
		if h != head || n == max {
			closeCmd()
			head = h
			out.WriteString(h)
		} else {
			out.WriteString(", ")
		}
		out.WriteString(elem)
		n++
	}
	closeCmd()
	return out.String()
}

// elementCommand splits an add or delete of one element, as knftables
// writes it, into the command up to its opening brace and the element.
func elementCommand(line string) (head, elem string, ok bool) {
	if !strings.HasPrefix(line, "add element ") && !strings.HasPrefix(line, "delete element ") {
		return "", "", false
	}
	open := strings.Index(line, " { ")
	if open < 0 || !strings.HasSuffix(line, " }") {
		return "", "", false
	}
	return line[:open+3], line[open+3 : len(line)-2], true
}
