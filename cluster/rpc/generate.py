"""Generate the gRPC modules in this package from proto/haremq/cluster.proto.

    python -m cluster.rpc.generate          # rewrite cluster_pb2*.py
    python -m cluster.rpc.generate --check  # exit 1 if the committed modules drifted
"""
from __future__ import annotations

import difflib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
PROTO = PROTO_DIR / "haremq" / "cluster.proto"
HERE = Path(__file__).resolve().parent
OUTPUTS = ("cluster_pb2.py", "cluster_pb2_grpc.py", "cluster_pb2.pyi")


def generate(out: Path) -> None:
    from grpc_tools import protoc
    with tempfile.TemporaryDirectory() as tmp:
        code = protoc.main(["protoc", f"-I{PROTO_DIR}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                            f"--grpc_python_out={tmp}", str(PROTO)])
        if code != 0:
            raise SystemExit(f"protoc failed with {code}")
        _copy(Path(tmp) / "haremq", out)


def _copy(gen: Path, out: Path) -> None:
    for name in OUTPUTS:
        text = (gen / name).read_text()
        # the generated stub imports its sibling by proto path; make it package-relative
        text = text.replace("from haremq import cluster_pb2 as", "from . import cluster_pb2 as")
        (out / name).write_text(text)


def main(argv: list[str]) -> int:
    if "--check" in argv:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            drift = []
            for name in OUTPUTS:
                new = (Path(tmp) / name).read_text().splitlines()
                old = (HERE / name).read_text().splitlines() if (HERE / name).exists() else []
                if new != old:
                    drift.append(name)
                    sys.stdout.writelines(line + "\n" for line in difflib.unified_diff(old, new, name, name, n=1))
            if drift:
                print(f"generated modules drifted from {PROTO.name}: {', '.join(drift)}")
                return 1
        return 0
    generate(HERE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
