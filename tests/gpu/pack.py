"""Pack a GPU run's results for the trip back (and for committing): every trace trimmed to
what annotation and verification read, with the ledgers, reports and metadata, in one tarball.

    python tests/gpu/pack.py OUT_DIR RESULTS.tgz
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
import verify_traces

KEEP = ("report_rank", "footprint_rank", "meta.json", ".autoannot", "run_output", ".log", "checks_",
        ".txt", "full_rank", "results_")
TRIMMED = ("eager_", "graph_", "inline_", "complex_")


def main() -> int:
    source, target = Path(sys.argv[1]), Path(sys.argv[2])
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(target, "w:gz") as tar:
        for path in sorted(source.rglob("*")):
            if not path.is_file():
                continue
            relative = path.relative_to(source)
            name = path.name
            if name.endswith(".json") and name.startswith(TRIMMED) \
                    and not name.endswith(".autoannot.json"):  # full_rank*: kept whole
                trimmed = Path(tmp) / relative
                trimmed.parent.mkdir(parents=True, exist_ok=True)
                verify_traces.trim(path, trimmed)
                tar.add(trimmed, arcname=str(relative))
            elif any(key in name for key in KEEP):
                tar.add(path, arcname=str(relative))
    print(f"packed {target} ({target.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
