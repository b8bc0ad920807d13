"""The distribution installs under one import namespace (haremq.*): installed into an
environment that already has packages named `node` and `pipeline` (other distributions own
those names), it leaves both as they were and is importable itself. The Spark source is also
`pipeline.haremq_source`, a namespace portion that steps aside for such a package."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return next(out.glob("haremq-*.whl"))


def test_the_wheel_claims_no_top_level_package_but_haremq(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"haremq", "pipeline"}
    # `pipeline` is only a namespace portion: no __init__.py that would take the name over
    assert [n for n in names if n.startswith("pipeline/")] == ["pipeline/haremq_source.py"]


def _venv(tmp_path: Path, others=()) -> Path:
    """A fresh environment; `others`: package names another distribution installed there."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    for name in others:
        (site / name).mkdir()
        (site / name / "__init__.py").write_text(f'OWNER = "other {name}"\n')
    return venv


def _install_and_run(wheel: Path, venv: Path, probe: str) -> str:
    """Install the wheel (no dependencies) into `venv`, then what `probe` prints there."""
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=60,
                       cwd=venv.parent)      # not the checkout, whose folders `python -c` would import
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_installed_beside_packages_named_node_and_pipeline_all_stay_importable(wheel, tmp_path):
    out = _install_and_run(wheel, _venv(tmp_path, others=("node", "pipeline")),
                           "import node, pipeline, haremq.node.version as v, haremq.pipeline as p; "
                           "print(node.OWNER, '|', pipeline.OWNER, '|', v.__version__, '|', callable(p.register))")
    other_node, other_pipeline, version, register = (part.strip() for part in out.split("|"))
    assert (other_node, other_pipeline, register) == ("other node", "other pipeline", "True")
    assert version and version[0].isdigit()


def test_without_another_pipeline_the_source_is_also_pipeline_haremq_source(wheel, tmp_path):
    out = _install_and_run(wheel, _venv(tmp_path),
                           "import pipeline, pkgutil; print([m.name for m in pkgutil.iter_modules(pipeline.__path__)], "
                           "getattr(pipeline, '__file__', None))")
    assert out == "['haremq_source'] None"      # a namespace package, holding the source module
