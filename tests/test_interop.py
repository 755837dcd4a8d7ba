"""Our checkpoints, proofs and cosignatures, checked by implementations no one
here wrote: Go's golang.org/x/mod/sumdb (note and tlog; Debian's
golang-golang-x-mod-dev) and the PyPI package aics-tlog (Python >= 3.12).

Locally these skip when a tool is missing; under CI (CI=true) a missing tool
fails, because .ci/run installs both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

from deleatur import Memory, NewMemory
from deleatur.log.witness import Witness, format_request

HERE = Path(__file__).parent / "interop"
ROOT = Path(__file__).parent.parent


def _missing(what: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{what} is required under CI (.ci/run installs it)")
    pytest.skip(f"{what} is not installed")


@pytest.fixture(scope="session")
def goverify(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go = shutil.which("go")
    gocode = Path("/usr/share/gocode/src/golang.org/x/mod/sumdb/note")
    if go is None or not gocode.is_dir():
        _missing("Go with golang-golang-x-mod-dev")
    binary = tmp_path_factory.mktemp("go") / "goverify"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": "/usr/share/gocode", "GOCACHE": str(binary.parent / "cache")}
    subprocess.run([go, "build", "-o", str(binary), "."], cwd=HERE / "goverify", env=env, check=True)
    return binary


@pytest.fixture(scope="session")
def aics_python() -> Path:
    python = Path(os.environ.get("DELEATUR_INTEROP_PYTHON", ROOT / ".venv-interop" / "bin" / "python"))
    if not python.exists() or subprocess.run([python, "-c", "import aics_tlog"], check=False).returncode != 0:
        _missing("a Python >= 3.12 with aics-tlog (DELEATUR_INTEROP_PYTHON)")
    return python


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False)


@pytest.fixture
def grown(memory: Memory) -> Memory:
    memory.remember_many([NewMemory(f"note {i}", subject=f"s{i % 5}") for i in range(40)])
    return memory


def test_go_reference_verifies_checkpoint_and_proofs(grown: Memory, goverify: Path, tmp_path: Path) -> None:
    vkey = grown.announced_keys()[0].vkey
    old = grown.checkpoint()
    (tmp_path / "old.txt").write_text(old.format())
    grown.remember_many([NewMemory(f"more {i}", subject="s") for i in range(23)])
    (tmp_path / "cp.txt").write_text(grown.checkpoint().format())
    result = _run(goverify, "checkpoint", vkey, tmp_path / "cp.txt")
    assert result.returncode == 0, result.stderr
    assert f" {grown.backend.log_size()} " in result.stdout

    for index in (0, 1, 17, 40, grown.backend.log_size() - 1):
        (tmp_path / "p.txt").write_text(grown.prove(index).format())
        result = _run(goverify, "inclusion", vkey, tmp_path / "p.txt")
        assert result.returncode == 0, (index, result.stderr)

    (tmp_path / "req.txt").write_text(grown.consistency_request(old))
    result = _run(goverify, "consistency", vkey, tmp_path / "old.txt", tmp_path / "req.txt")
    assert result.returncode == 0, result.stderr


def test_go_reference_rejects_what_we_reject(grown: Memory, goverify: Path, tmp_path: Path) -> None:
    vkey = grown.announced_keys()[0].vkey
    proof = grown.prove(5).format()
    lines = proof.split("\n")
    lines[3] = "A" + lines[3][1:] if not lines[3].startswith("A") else "B" + lines[3][1:]
    (tmp_path / "bad.txt").write_text("\n".join(lines))
    assert _run(goverify, "inclusion", vkey, tmp_path / "bad.txt").returncode == 1
    size = grown.backend.log_size()
    cp = grown.checkpoint().format().replace(f"\n{size}\n", f"\n{size + 1}\n", 1)
    assert f"\n{size + 1}\n" in cp
    (tmp_path / "cp.txt").write_text(cp)
    assert _run(goverify, "checkpoint", vkey, tmp_path / "cp.txt").returncode == 1


def test_aics_tlog_verifies_checkpoint_cosignature_and_inclusion(
    grown: Memory, aics_python: Path, tmp_path: Path
) -> None:
    witness = Witness.create(tmp_path / "w.db", "witness.example/w1")
    witness.add_log(grown.announced_keys()[0].vkey)
    checkpoint = grown.checkpoint()
    cosigned = checkpoint.with_signatures(witness.add_checkpoint(format_request(0, [], checkpoint)))
    (tmp_path / "cosigned.txt").write_text(cosigned.format())
    (tmp_path / "p.txt").write_text(grown.prove(12).format())
    result = _run(
        aics_python,
        HERE / "aics_verify.py",
        grown.announced_keys()[0].vkey,
        witness.vkey,
        tmp_path / "cosigned.txt",
        tmp_path / "p.txt",
    )
    assert result.returncode == 0, result.stderr
    assert "witness.example/w1" in result.stdout

    # A cosignature over another timestamp than the one it carries must fail there too.
    line = cosigned.format().rstrip("\n").split("\n")[-1]
    tampered = cosigned.format().replace(line, line[:-6] + ("AAAAA=" if not line.endswith("AAAAA=") else "BBBBB="))
    (tmp_path / "bad.txt").write_text(tampered)
    bad = _run(
        aics_python,
        HERE / "aics_verify.py",
        grown.announced_keys()[0].vkey,
        witness.vkey,
        tmp_path / "bad.txt",
        tmp_path / "p.txt",
    )
    assert bad.returncode == 1
    witness.close()


def test_go_reference_verifies_the_golden_checkpoint_and_proof(goverify: Path) -> None:
    vkey = (Path(__file__).parent / "golden" / "keys.txt").read_text().split("\n")[0]
    golden = Path(__file__).parent / "golden"
    assert _run(goverify, "checkpoint", vkey, golden / "checkpoint.txt").returncode == 0
    assert _run(goverify, "inclusion", vkey, golden / "index-5.tlog-proof").returncode == 0
