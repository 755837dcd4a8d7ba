"""Check a deleatur checkpoint and its witness cosignatures with aics-tlog, an
independent C2SP implementation from PyPI (it needs Python >= 3.12, so this runs
in its own interpreter and shares no code with deleatur).

    python aics_verify.py LOG_VKEY WITNESS_VKEY COSIGNED_CHECKPOINT_FILE TLOG_PROOF_FILE
"""

import base64
import sys
from pathlib import Path

from aics_tlog import parse_note, parse_vkey, verify_checkpoint, verify_inclusion
from aics_tlog.checkpoint import checkpoint_from_note
from aics_tlog.hashing import leaf_hash


def main() -> int:
    log_vkey, witness_vkey, checkpoint_file, proof_file = sys.argv[1:5]
    note = parse_note(Path(checkpoint_file).read_text())
    result = verify_checkpoint(note, parse_vkey(log_vkey), [parse_vkey(witness_vkey)], quorum=1)
    if not result.ok:
        print(f"checkpoint: {result.error}", file=sys.stderr)
        return 1
    head, _, checkpoint_text = Path(proof_file).read_text().partition("\n\n")
    lines = head.split("\n")
    entry = base64.b64decode(lines[1].removeprefix("extra "))
    index = int(lines[2].removeprefix("index "))
    proof = [base64.b64decode(line) for line in lines[3:]]
    checkpoint, _ = checkpoint_from_note(checkpoint_text)
    if not verify_inclusion(leaf_hash(entry), index, checkpoint.size, proof, checkpoint.root):
        print("inclusion proof does not verify", file=sys.stderr)
        return 1
    print(f"OK checkpoint {result.size} cosigned by {', '.join(result.witnesses)}; inclusion {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
