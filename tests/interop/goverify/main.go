// Command goverify checks deleatur's checkpoints and proofs with Go's reference
// implementation of signed notes and transparency logs (golang.org/x/mod/sumdb).
// It shares no code with deleatur.
//
//	goverify checkpoint VKEY CHECKPOINT_FILE
//	goverify inclusion VKEY TLOG_PROOF_FILE          (the entry is in the "extra" line)
//	goverify consistency VKEY OLD_CHECKPOINT_FILE ADD_CHECKPOINT_REQUEST_FILE
package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func read(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		fail("read %s: %v", path, err)
	}
	return string(data)
}

// openCheckpoint verifies the note with the reference verifier, then parses the
// checkpoint body (origin, size, root).
func openCheckpoint(vkey, text string) (string, int64, tlog.Hash) {
	verifier, err := note.NewVerifier(vkey)
	if err != nil {
		fail("verifier key: %v", err)
	}
	n, err := note.Open([]byte(text), note.VerifierList(verifier))
	if err != nil {
		fail("note.Open: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(n.Text, "\n"), "\n")
	if len(lines) < 3 {
		fail("checkpoint has %d lines", len(lines))
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		fail("size: %v", err)
	}
	raw, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(raw) != tlog.HashSize {
		fail("root hash: %v", err)
	}
	var root tlog.Hash
	copy(root[:], raw)
	return lines[0], size, root
}

func hashes(lines []string) []tlog.Hash {
	out := make([]tlog.Hash, 0, len(lines))
	for _, line := range lines {
		raw, err := base64.StdEncoding.DecodeString(line)
		if err != nil || len(raw) != tlog.HashSize {
			fail("proof hash %q: %v", line, err)
		}
		var h tlog.Hash
		copy(h[:], raw)
		out = append(out, h)
	}
	return out
}

func main() {
	if len(os.Args) < 4 {
		fail("usage: goverify checkpoint|inclusion|consistency VKEY FILE...")
	}
	vkey := os.Args[2]
	switch os.Args[1] {
	case "checkpoint":
		origin, size, root := openCheckpoint(vkey, read(os.Args[3]))
		fmt.Printf("OK checkpoint %s %d %s\n", origin, size, root)
	case "inclusion":
		head, checkpoint, found := strings.Cut(read(os.Args[3]), "\n\n")
		if !found {
			fail("tlog-proof: no empty line")
		}
		lines := strings.Split(head, "\n")
		if lines[0] != "c2sp.org/tlog-proof@v1" || !strings.HasPrefix(lines[1], "extra ") || !strings.HasPrefix(lines[2], "index ") {
			fail("tlog-proof: unexpected header")
		}
		entry, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(lines[1], "extra "))
		if err != nil {
			fail("extra: %v", err)
		}
		index, err := strconv.ParseInt(strings.TrimPrefix(lines[2], "index "), 10, 64)
		if err != nil {
			fail("index: %v", err)
		}
		_, size, root := openCheckpoint(vkey, checkpoint)
		if err := tlog.CheckRecord(hashes(lines[3:]), size, root, index, tlog.RecordHash(entry)); err != nil {
			fail("tlog.CheckRecord: %v", err)
		}
		fmt.Printf("OK inclusion %d %d\n", index, size)
	case "consistency":
		_, oldSize, oldRoot := openCheckpoint(vkey, read(os.Args[3]))
		head, checkpoint, found := strings.Cut(read(os.Args[4]), "\n\n")
		if !found {
			fail("request: no empty line")
		}
		lines := strings.Split(head, "\n")
		claimed, err := strconv.ParseInt(strings.TrimPrefix(lines[0], "old "), 10, 64)
		if err != nil || claimed != oldSize {
			fail("request old size %q does not match the old checkpoint's %d", lines[0], oldSize)
		}
		_, newSize, newRoot := openCheckpoint(vkey, checkpoint)
		if err := tlog.CheckTree(hashes(lines[1:]), newSize, newRoot, oldSize, oldRoot); err != nil {
			fail("tlog.CheckTree: %v", err)
		}
		fmt.Printf("OK consistency %d %d\n", oldSize, newSize)
	default:
		fail("unknown mode %s", os.Args[1])
	}
}
