"""Write docs/versions.md from the matrix results ($ROOT/results/*.tsv, see matrix.sh).

    python scripts/matrix/summarize.py [ROOT] [OUTPUT]

An environment without results under ROOT keeps its row from OUTPUT as it is (measured in an
earlier pass, perhaps on another machine); one of PLANNED without either is listed as not run.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tfdp-matrix")
OUTPUT = Path(sys.argv[2] if len(sys.argv) > 2 else Path(__file__).parents[2] / "docs/versions.md")
CHECKS = (
    "install",
    "demo",
    "demo-tf_keras",
    "doctor",
    "doctor-tf_keras",
    "smoke",
    "smoke-tf_keras",
)
# One environment per TensorFlow minor with the Keras pip installs today ("latest"), the
# oldest declared Keras, and the Keras current at the minor's release where >= the floor.
PLANNED = (
    "tf2.16-keras3.10.0",
    "tf2.16-keraslatest",
    "tf2.21-keraslatest",
    "tf2.21-keras3.13.2",
    "tf2.17-keras3.10.0",
    "tf2.17-keraslatest",
    "tf2.18-keras3.10.0",
    "tf2.18-keraslatest",
    "tf2.19-keras3.10.0",
    "tf2.19-keraslatest",
    "tf2.20-keras3.10.0",
    "tf2.20-keras3.11.2",
    "tf2.20-keraslatest",
    "tf2.21-kerasmain",
    "tf2.22-keraslatest",  # 2.22.0rc0 with keras-nightly and tf-keras-nightly
)

HEADER = Path(__file__).with_name("versions_header.md")


def earlier_rows(path: Path) -> dict[str, str]:
    """The table rows of an existing docs/versions.md, by environment."""
    if not path.exists():
        return {}
    rows = {}
    for line in path.read_text().splitlines():
        cells = line.split(" | ")
        if line.startswith("| tf2.") and len(cells) > 1:
            rows[cells[0].removeprefix("| ").strip()] = line
    return rows


def main() -> None:
    earlier = earlier_rows(OUTPUT)
    results: dict[str, dict[str, tuple[str, str]]] = {}
    for path in sorted(ROOT.glob("results/*.tsv")):
        for line in path.read_text().splitlines():
            env, check, outcome, detail = [*line.split("\t"), "", "", ""][:4]
            results.setdefault(env, {})[check] = (outcome, detail)
    rows = [
        "| environment | " + " | ".join(CHECKS) + " | other |",
        "|---" * (len(CHECKS) + 2) + "|",
    ]
    for env in (*PLANNED, *sorted((set(results) | set(earlier)) - set(PLANNED))):
        if env not in results and env in earlier:
            rows.append(earlier[env])
            continue
        found = results.get(env, {})
        cells = []
        for check in CHECKS:
            outcome, detail = found.get(check, ("not run", ""))
            cells.append(f"{outcome} {detail}".strip().replace("|", "/"))
        other = "; ".join(
            f"{check}: {outcome} {detail}".strip().replace("|", "/")
            for check, (outcome, detail) in found.items()
            if check not in CHECKS
        )
        rows.append(f"| {env} | " + " | ".join(cells) + f" | {other} |")
    OUTPUT.write_text(HEADER.read_text() + "\n".join(rows) + "\n")
    kept = len(set(earlier) - set(results))
    print(f"wrote {OUTPUT} ({len(results)} environments with results, {kept} rows kept)")


if __name__ == "__main__":
    main()
