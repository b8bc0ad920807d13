"""A static security check: ruff's flake8-bandit rules (S: shell injection, hard-coded secrets,
unsafe deserialisation, weak randomness for secrets, swallowed exceptions, ...) over the code that
ships, node/ cluster/ pipeline/ bench/. A finding is fixed, or justified where it stands
(`# noqa: S603 - why`); pyproject.toml's [tool.ruff.lint.per-file-ignores] says why for the few
whole files. ruff is a test dependency (pinned in constraints.txt)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("node", "cluster", "pipeline", "bench")


def _ruff() -> str:
    local = Path(sys.executable).parent / "ruff"
    found = str(local) if local.is_file() else shutil.which("ruff")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("ruff is not installed: pip install -c constraints.txt -e '.[test]'")
        pytest.skip("ruff is not installed (pip install -c constraints.txt -e '.[test]')")
    return found


def ruff_security(*paths: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([_ruff(), "check", "--select", "S", "--no-cache", "--output-format", "concise", *paths],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def test_the_shipped_code_has_no_security_findings():
    done = ruff_security(*SHIPPED)
    assert done.returncode == 0, "ruff --select S:\n" + done.stdout + done.stderr


def test_the_check_finds_what_it_is_for(tmp_path):
    """It can fail: a shell command built from input, a hard-coded password and pickle."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "bad.py").write_text(
        "import pickle\nimport subprocess\n\n\ndef run(name, blob):\n"
        "    subprocess.call('ls ' + name, shell=True)\n    return pickle.loads(blob)\n\n\nPASSWORD = 'hunter2'\n")
    done = ruff_security("bad.py", cwd=tmp_path)
    assert done.returncode == 1
    for code in ("S602", "S301", "S105"):
        assert code in done.stdout, done.stdout
