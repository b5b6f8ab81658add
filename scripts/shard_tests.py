"""Split one pytest file's GPU tests into units for ``gpu_check.sh`` (``GPU_TEST_SHARDS``).

Cases go one by one, longest first, onto the least-loaded unit; a case's weight is its seconds in
``tests/gpu_durations.txt`` ("SECONDS NODEID" lines, written by an earlier ``gpu_check.sh`` run as
``$OUT/gpu_durations.txt``) or, where it has none, the median of the known ones (1 s without any).
Session 25: whole test functions per unit put both dtypes of ``test_every_tile_fprop_and_dgrad``
in one process, which ran past 470 s while the other units finished early.

    python scripts/shard_tests.py FILE UNITS PREFIX   # writes PREFIX@J.ids, prints the unit count
    python scripts/shard_tests.py --gather DIR        # durations from DIR/*.times, merged over
                                                      # tests/gpu_durations.txt, to stdout
    python scripts/shard_tests.py --order FILE...     # the files, longest known total first
    python scripts/shard_tests.py --remaining DIR     # node ids of DIR's shards that never
                                                      # finished (cut or not started), to stdout
    python scripts/shard_tests.py --split IDS UNITS PREFIX  # node ids from the file IDS dealt
                                                      # like a test file's cases

``*.times`` files hold "start|end EPOCH NODEID" lines (``tests/conftest.py`` writes them under
``TILEWISE_TEST_TIMES``). A test with a start and no end was cut off: it counts from its start to
its file's last write (when the unit was killed), a lower bound that still marks it as long.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

DURATIONS = Path("tests/gpu_durations.txt")


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per node id from a durations file; empty if there is none."""
    known: dict[str, float] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return known
    for line in lines:
        parts = line.strip().split(maxsplit=1)  # node ids may hold spaces (a dataclass repr)
        if len(parts) == 2 and not line.startswith("#"):
            try:
                known[parts[1]] = float(parts[0])
            except ValueError:
                continue
    return known


def plan(cases: Sequence[str], units: int, known: Mapping[str, float]) -> list[list[str]]:
    """``cases`` in at most ``units`` non-empty lists, the longest first onto the least loaded
    (ties: the unit with fewer cases, then the first); each case exactly once."""
    if units < 1:
        raise ValueError(f"argument 'units' must be >= 1, got {units}")
    times = sorted(known.values())
    typical = times[len(times) // 2] if times else 1.0
    weight = {c: known.get(c, typical) for c in cases}
    bins: list[list[str]] = [[] for _ in range(units)]
    load = [0.0] * units
    for case in sorted(dict.fromkeys(cases), key=lambda c: -weight[c]):  # stable for ties
        j = min(range(units), key=lambda j: (load[j], len(bins[j])))
        bins[j].append(case)
        load[j] += weight[case]
    return [b for b in bins if b]


def order(files: Sequence[str], known: Mapping[str, float]) -> list[str]:
    """``files`` by their tests' known total seconds, longest first (ties and unknown files keep
    their order, last): gpu_check starts the slow files' units in this order, so the longest do
    not wait for a job slot (session 26: test_linear's shards, started last, were cut)."""
    total = {f: sum(t for n, t in known.items() if n.split("::")[0] == f) for f in files}
    return sorted(files, key=lambda f: -total[f])


def _events(path: Path) -> list[tuple[str, float, str]]:
    """The well-formed ("start" | "end", epoch, node id) lines of a ``*.times`` file (none if
    there is no file)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(maxsplit=2)
        if len(parts) != 3 or parts[0] not in ("start", "end"):
            continue
        try:
            out.append((parts[0], float(parts[1]), parts[2]))
        except ValueError:
            continue
    return out


def gather(folder: Path, known: Mapping[str, float]) -> dict[str, float]:
    """Seconds per test from the ``*.times`` files in ``folder``, over ``known``."""
    out = dict(known)
    for path in sorted(folder.glob("*.times")):
        starts: dict[str, float] = {}
        for kind, stamp, node in _events(path):
            if kind == "start":
                starts[node] = stamp
            elif node in starts:
                out[node] = stamp - starts.pop(node)
        cut_at = path.stat().st_mtime
        for node, start in starts.items():  # cut off: at least this long
            out[node] = max(out.get(node, 0.0), cut_at - start)
    return out


def remaining(folder: Path) -> list[str]:
    """Node ids of ``folder``'s shard units (``shards/NAME.ids``) that never ended in their unit's
    ``NAME.times``: the cases a unit's time limit cut, or that a unit never started (session 39
    reran 16 such cases of the grouped-conv files by hand; ``GPU_TEST_IDS`` takes this list)."""
    out: list[str] = []
    for ids in sorted((folder / "shards").glob("*.ids")):
        ended = {n for kind, _, n in _events(folder / f"{ids.stem}.times") if kind == "end"}
        out += [n for n in ids.read_text().splitlines() if n.strip() and n not in ended]
    return out


def write_units(bins: list[list[str]], prefix: str) -> int:
    """Each unit's node ids into ``PREFIX@J.ids``; the number of units."""
    for j, b in enumerate(bins):
        Path(f"{prefix}@{j}.ids").write_text("\n".join(b) + "\n")
    return len(bins)


def collect(path: str) -> list[str] | None:
    """The GPU-marked node ids of one test file, or None if collection fails."""
    try:
        res = subprocess.run(
            [sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q"]
            + ["-p", "no:cacheprovider", path],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return None
    if res.returncode not in (0, 5):  # 5: nothing collected
        return None
    return [line for line in res.stdout.splitlines() if line.startswith(path + "::")]


def main() -> None:
    if sys.argv[1] == "--order":
        print("\n".join(order(sys.argv[2:], read_durations())))
        return
    if sys.argv[1] == "--remaining":
        print("\n".join(remaining(Path(sys.argv[2]))))
        return
    if sys.argv[1] == "--split":
        ids = [n.strip() for n in Path(sys.argv[2]).read_text().splitlines() if n.strip()]
        print(write_units(plan(ids, int(sys.argv[3]), read_durations()), sys.argv[4]) if ids else 0)
        return
    if sys.argv[1] == "--gather":
        times = gather(Path(sys.argv[2]), read_durations())
        for node, sec in sorted(times.items(), key=lambda kv: -kv[1]):
            print(f"{sec:.2f} {node}")
        return
    path, units, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cases = collect(path)
    if cases is None:
        print(0)  # gpu_check runs the whole file as one unit
        return
    print(write_units(plan(cases, units, read_durations()), prefix))


if __name__ == "__main__":
    main()
