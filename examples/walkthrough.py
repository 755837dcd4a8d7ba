"""The main job, end to end through the real ``deleatur`` command, in a fresh
temporary store: every line printed with ``$`` is a command a user could type."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

DELEATUR = Path(sys.executable).with_name("deleatur")


def step(title: str) -> None:
    print(f"\n# {title}", flush=True)


def run(*args: str, expect: int = 0) -> str:
    print("$ deleatur " + shlex.join(args), flush=True)
    result = subprocess.run([str(DELEATUR), *args], capture_output=True, text=True, check=False)
    sys.stdout.write(result.stdout)
    sys.stdout.write(result.stderr)
    if result.returncode != expect:
        sys.exit(f"walkthrough failed: exit code {result.returncode}, expected {expect}")
    return result.stdout.strip()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="deleatur-demo-") as tmp:
        os.environ["DELEATUR_STORE"] = str(Path(tmp) / "memory.db")
        os.environ.setdefault("COLUMNS", "140")

        step("Create a store: the database, its key store, and a master key file (mode 0600)")
        run("init")

        step("An agent remembers facts about two people, each tagged with its subject")
        alice_email = run(
            "remember", "Alice prefers email over phone calls", "--subject", "Alice Martin", "--source", "crm/alice"
        )
        run("remember", "Alice's phone is +33 6 12 34 56 78", "--subject", "Alice Martin", "--key", "alice::phone")
        bob = run("remember", "Bob's phone is +1 555 0100", "--subject", "Bob Stone", "--key", "bob::phone")
        run("remember", "Bob asked for a refund on order 1042", "--subject", "bob stone", "--derived-from", bob)
        run("remember", "Support note for another customer", "--subject", "Carol", "--user", "user10")
        # A few more, so that "phone" is in a minority of the records: BM25 weighs a word
        # found in most of them next to nothing (scores of ~1e-6).
        run("remember", "Alice works at Acme in Lyon", "--subject", "Alice Martin")
        run("remember", "Bob's birthday is in May", "--subject", "Bob Stone")
        run("remember", "Dan prefers the phone, never email, and asks for a call back", "--subject", "Dan Ray")
        run("remember", "Dan's order 1043 shipped on Monday", "--subject", "Dan Ray")

        step("Recall ranks by BM25 within one memory space")
        run("recall", "phone")
        run("recall", "phone", "--user", "user1")

        step("A new value for a key supersedes the old one; both stay in history")
        run("remember", "Alice's phone is +33 6 99 99 99 99", "--subject", "Alice Martin", "--key", "alice::phone")
        run("history", "--key", "alice::phone")

        step("Art. 16 rectification: the inaccurate value is corrected, with reason and actor recorded")
        run(
            "rectify",
            "Alice's phone is +33 6 99 99 99 90",
            "--key",
            "alice::phone",
            "--reason",
            "subject reported a typo",
            "--actor",
            "dpo@example.com",
            "--erase-previous",
        )
        run("history", "--key", "alice::phone")

        step("Retire a fact that stopped being true: no longer recalled, kept in history")
        run("forget", "--key", "bob::phone")
        run("list")
        run("list", "--history", "--subject", "Bob Stone")

        step("Scripts get JSON")
        run("list", "--subject", "ALICE MARTIN", "--json")

        step("Bad input is refused with a clear error and exit code 2, and nothing is written")
        run("remember", "   ", "--subject", "Alice Martin", expect=2)
        run("get", "not-an-id", expect=2)

        step("Every change is an entry in a signed, append-only Merkle log (RFC 6962, C2SP checkpoints)")
        tmpdir = Path(tmp)
        vkey = run("keys", "export-public")
        receipt = tmpdir / "receipt.json"
        run("remember", "Bob prefers tea", "--subject", "Bob Stone", "--receipt", str(receipt))
        run("verify-receipt", str(receipt), "--key", vkey)
        old = tmpdir / "checkpoint.txt"
        run("log", "checkpoint", "--out", str(old))
        run("remember", "Bob's order 1042 shipped", "--subject", "Bob Stone")
        run("log", "entries", "--start", "6", "--limit", "3")

        step("A witness cosigns a checkpoint only if the log provably extends what it saw before")
        state = tmpdir / "witness.db"
        run("witness", "init", "--state", str(state), "--name", "witness.example/w1")
        run("witness", "add-log", "--state", str(state), vkey)
        first = tmpdir / "first.txt"
        run("log", "consistency", str(old), "--new-witness", "--out", str(first))
        run("witness", "cosign", "--state", str(state), str(first))
        request = tmpdir / "request.txt"
        run("log", "consistency", str(old), "--out", str(request))
        run("witness", "cosign", "--state", str(state), str(request))

        step("Anyone can re-derive the log and check it against a pinned key and checkpoint")
        run("log", "verify", "--expected-pubkey", vkey, "--expected-checkpoint", str(old))

        step("A tampered receipt fails, naming the check")
        data = receipt.read_text().replace('"entry": "eyJ', '"entry": "eyK', 1)
        (tmpdir / "tampered.json").write_text(data)
        run("verify-receipt", str(tmpdir / "tampered.json"), "--key", vkey, expect=1)

        step("Principals: an agent's API key, scoped to one user; every call is authorized and audited")
        bot = json.loads(run("principals", "create", "support-bot", "--role", "agent", "--scope", "default", "--json"))
        run("--api-key", bot["api_key"], "whoami")
        run("--api-key", bot["api_key"], "recall", "phone")
        run("--api-key", bot["api_key"], "recall", "note", "--user", "user10", expect=3)

        step("A decision keeps a signed snapshot of exactly the beliefs it used")
        decision = json.loads(
            run("decision", "record", "confirm the refund by email", "--used", alice_email, "--json")
        )["decision"]["id"]
        run("decision", "explain", decision)

        step("Art. 17 erasure: first the blast radius, changing nothing")
        run("remember", "Alice mentioned a refund", "--subject", "Support log", "--derived-from", alice_email)
        run("remember", "Bob met Alice Martin at the fair", "--subject", "Bob Stone")
        dsar = ("--request-id", "DSAR-17", "--basis", "Art. 17(1)(a)", "--requester", "dpo@example.com")
        run("erase", "Alice Martin", *dsar, "--dry-run")
        run("residue", "Alice Martin", "--identifier", "+33 6")

        step("Erase: records, history, lineage, index terms and the subject's key; signed tombstones")
        run("erase", "Alice Martin", *dsar)
        run("erase", "Alice Martin", *dsar)  # the same request id again: the same result, nothing more
        run("requests")
        run("list", "--history")

        step("The erasure blanked Alice's belief in the decision, re-signed it and logged the link")
        run("decision", "explain", decision)

        step("The audit trail: every call, content-free and verifiable; the auditor keeps the head it saw")
        run("audit", "show", "--calls", "--actor", bot["id"])
        run("audit", "verify", "--expected-pubkey", vkey, "--state", str(tmpdir / "auditor.state"))

        step("A portable certificate, verified offline with the public key alone")
        cert = tmpdir / "DSAR-17.cert.json"
        run("certificate", "--request-id", "DSAR-17", "--out", str(cert))
        pinned = ("--expected-pubkey", vkey, "--expected-checkpoint", str(old))
        run("verify", str(cert), "--store", os.environ["DELEATUR_STORE"], *pinned)

        step("One changed byte in the certificate (its issue time) and it fails")
        forged = cert.read_text().replace('"issued_at": "2', '"issued_at": "1', 1)
        (tmpdir / "forged.cert.json").write_text(forged)
        run("verify", str(tmpdir / "forged.cert.json"), "--store", os.environ["DELEATUR_STORE"], *pinned, expect=1)

        step("On disk, after the erasure: none of Alice's names, keys or texts, in any file of the store")
        blob = b"".join(p.read_bytes() for p in Path(tmp).iterdir() if p.name.startswith("memory.db"))
        for needle in ("Alice Martin", "alice::phone", "+33 6 99 99 99 90", "prefers"):
            print(f"{needle!r} in any store file: {needle.encode() in blob}")
        print("# Nor a word of Bob's live records: the full-text index holds keyed hashes of words")
        for needle in ("refund", "shipped"):
            print(f"{needle!r} in any store file: {needle.encode() in blob}")
        run("recall", "refund")

        print("\nwalkthrough complete")


if __name__ == "__main__":
    main()
