"""The summary tables of saved study results: the CLI's ``bench report``, ``bench merge``,
``bench gconv-bars`` and ``bench mlp-targets`` commands, and the table each study prints after
it runs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path


def report_pointwise(records: list[dict], title: str) -> None:
    """The pointwise (and tour) table: fractions of copy, speedups, the issue-2 target."""
    from tilewise.bench.pointwise import errors, summarize, summary_table
    from tilewise.bench.results import format_table

    print(f"\n{title}")
    print(
        "(tilewise/eager/compile: effective bandwidth as a fraction of the measured copy "
        "ceiling; x: tilewise speedup; target: >= 0.85 at >= 64 MB and faster than both)"
    )
    print(format_table(*summary_table(summarize(records))))
    print_errors(errors(records))


def report_gconv(records: list[dict], title: str) -> None:
    """The isolated grouped-conv table: events, graph replay, profiler and L2 columns."""
    from tilewise.bench.gconv import errors, summary_table
    from tilewise.bench.results import format_table

    print(f"\n{title}")
    print("(GB/s: compulsory bytes / CUDA-event median; frac: of the measured copy ceiling;")
    print(" prof: the same from the profiler's sum of every kernel of the pass)")
    print(format_table(*summary_table(records)))
    print_errors(errors(records))


def report_insitu(records: list[dict], title: str) -> None:
    """The in-situ tables: per-pass kernel bandwidth in the stacks and whole-step times."""
    from tilewise.bench.gconv_insitu import errors, summary_tables
    from tilewise.bench.results import format_table

    print(f"\n{title}")
    print("(GB/s: one layer's compulsory bytes / its grouped-conv kernel time in the stack;")
    print(" tw gconv us: tilewise's grouped-conv kernels alone;")
    print(" steps: forward + backward + SGD, ms)")
    for headers, rows in summary_tables(records):
        print(format_table(headers, rows))
        print()
    print_errors(errors(records))


def report_mlp(records: list[dict], title: str) -> None:
    """The MLP grid table (and the training-step table when the study timed one)."""
    from tilewise.bench.mlp import errors, summary_table, train_table
    from tilewise.bench.results import format_table

    print(f"\n{title}")
    print("(us per forward, median; eager/compile: CUDA events per call, host overhead included;")
    print(" graph/tilewise/strassen: CUDA-graph replay; best: faster of tilewise and strassen;")
    print(" targets: >= 3x eager at hidden <= 1024, batch <= 64, 8 layers; >= 1.0x graph)")
    print(format_table(*summary_table(records)))
    headers, rows = train_table(records)
    if rows:
        print("\n(training step: forward + MSE loss + backward + AdamW; targets: tilewise >= 5x")
        print(" eager and faster than torch.compile)")
        print(format_table(headers, rows))
    print_errors(errors(records))


def print_errors(errs: list[str]) -> None:
    """The measurements a study could not report, one line each with its reason."""
    if errs:
        print(f"\n{len(errs)} measurements not reported:")
        for line in errs:
            print("  " + line)


def cmd_report(args: argparse.Namespace) -> int:
    """``tilewise bench report DIR``: the summary tables of the JSON results found in DIR
    (files named after their study: pointwise*, tour*, gconv*, gconv-insitu*, mlp*)."""
    from tilewise.bench.results import load_results

    reports = {  # longest prefix first
        "mlp": report_mlp,
        "gconv-insitu": report_insitu,
        "gconv": report_gconv,
        "pointwise": report_pointwise,
        "tour": report_pointwise,
    }
    found = 0
    for path in sorted(Path(args.dir).glob("*.json")):
        prefix = next((k for k in reports if path.name.startswith(k)), None)
        if prefix is None:
            continue
        try:
            data = load_results(path)
        except ValueError as exc:  # another script's JSON that shares a prefix
            print(f"skipped {path.name}: {exc}")
            continue
        found += 1
        title = f"{path.name} ({data['environment'].get('device_name')})"
        reports[prefix](list(data["records"]), title)
    if not found:
        print(f"no pointwise/tour/gconv/mlp results in {args.dir}")
        return 1
    return 0


def cmd_gconv_bars(args: argparse.Namespace) -> int:
    """``tilewise bench gconv-bars FILE...``: issue 3's bars, judged per reading of the isolated
    grouped-conv study's result files (several files: every reading of every file)."""
    from tilewise.bench.gconv_bars import bar_counts, bar_rows, bar_table
    from tilewise.bench.results import format_table, load_results

    records, devices = [], set()
    for path in args.files:
        data = load_results(path)
        if str(data["study"]).startswith("gconv-insitu"):  # block stacks: no isolated bars
            print(f"skipped {Path(path).name}: an in-situ study, not the isolated kernels")
            continue
        devices.add(data["environment"].get("device_name"))
        records += [r for r in data["records"] if "pass" in r and "c" in r]
    rows = bar_rows(records)
    if args.bar_only:
        rows = [r for r in rows if r.bar is not None]
    if not rows:
        print("no timed tilewise grouped-conv records in these files")
        return 1
    print(f"issue 3's bars on {', '.join(sorted(map(str, devices)))} (graph replay where timed)")
    print(format_table(*bar_table(rows)))
    for name, (met, judged) in bar_counts(rows).items():
        what = {
            "dram": ">= 0.85 / 0.75 of copy at >= 64 MB of activations",
            "l2": "above copy where the problem fits in L2",
            "cudnn": "not slower than cuDNN",
        }[name]
        print(f"{what}: {met} of {judged} readings")
    return 0


def cmd_mlp_targets(args: argparse.Namespace) -> int:
    """``tilewise bench mlp-targets FILE...``: issue 4's targets counted over MLP study result
    files, oldest first (each file judged alone, a cell's latest file counting; the misses
    listed, or every row with ``--all``). The files must come from one device."""
    from tilewise.bench.mlp_targets import (
        TARGETS,
        latest_rows,
        strassen_shares,
        target_counts,
        target_table,
    )
    from tilewise.bench.results import format_table

    parts, device = _one_device(args.files)
    runs = [[r for r in d["records"] if "impl" in r and "layers" in r] for d in parts]
    rows = latest_rows(runs)  # each file judged alone: ratios within one run
    if not rows:
        print("no cell of these files has the impls a target compares")
        return 1
    shown = rows if args.all else [r for r in rows if not r.met]
    print(f"issue 4's targets on {device} ({len(parts)} files)")
    if shown:
        print(format_table(*target_table(shown)))
    for name, (met, judged) in target_counts(rows).items():
        op = ">" if name == "train > compile" else ">="
        print(f"{name} ({TARGETS[name][1]} {op} {TARGETS[name][0]:.2f}x): {met} of {judged} cells")
    shares = strassen_shares(runs)
    if shares:
        below = [f"L{k[1]} b{k[2]} h{k[3]} {v:.3f}x" for k, v in shares.items() if v < 1.0]
        print(
            f"Strassen's own share (fused chain time / Strassen's, not a target) at "
            f"{len(shares)} cells: {min(shares.values()):.3f}-{max(shares.values()):.3f}x"
            + (f"; below 1.0x: {', '.join(below)}" if below else "")
        )
    return 0


def _one_device(files: Sequence[Path]) -> tuple[list[dict], str]:
    """The loaded result files and their one device; files of several devices are refused."""
    from tilewise.bench.results import load_results

    parts = [load_results(p) for p in files]
    devices = {str(d["environment"].get("device_name")) for d in parts}
    if len(devices) != 1:
        raise ValueError(f"argument 'files' mixes devices: {sorted(devices)}")
    return parts, devices.pop()


def unique_records(records: list[dict], fields: Sequence[str]) -> list[dict]:
    """``records`` with one per value of ``fields`` (none: all kept): a later record replaces an
    earlier one and takes the later place, so a cell re-run in a later part (a file listed
    later) wins, unless it failed (``error``) where the earlier one did not."""
    if not fields:
        return list(records)
    unknown = sorted(f for f in fields if not any(f in r for r in records))
    if unknown:
        raise ValueError(f"argument 'unique_by': no record has {unknown}")
    kept: dict[tuple, dict] = {}
    for r in records:  # a field a record lacks (a step record's pass) keys as None
        key = tuple(json.dumps(r.get(f), sort_keys=True) for f in fields)
        if r.get("error") and key in kept and not kept[key].get("error"):
            continue  # a failed re-run does not replace a reading
        kept.pop(key, None)  # re-inserted last: the order follows the latest part
        kept[key] = r
    return list(kept.values())


def cmd_merge(args: argparse.Namespace) -> int:
    """``tilewise bench merge STUDY FILE...``: one result file (and its table, and with
    ``--plot`` its figure) from studies run in parts, e.g. one process per batch size under a
    time limit. The parts must come from one device; each record keeps the fractions of the
    ceilings measured in its own run, and the merged file lists every part's ceilings."""
    from tilewise.bench.gconv import plot_gconv
    from tilewise.bench.gconv_insitu import plot_insitu
    from tilewise.bench.mlp import plot_mlp
    from tilewise.bench.results import load_results, result_path, save_results

    parts, device = _one_device(args.files)
    records = unique_records([r for d in parts for r in d["records"]], args.unique_by or ())
    names = [Path(p).name for p in args.files]
    copies = sorted(c for d in parts if (c := (d["ceilings"] or {}).get("copy_bytes_per_s")))
    ceilings = {"parts": [d["ceilings"] for d in parts], "files": names}
    if copies:  # the plots' ceiling line: the median of the parts' measurements
        ceilings["copy_bytes_per_s"] = copies[len(copies) // 2]
    env = parts[0]["environment"]
    target = result_path(args.study, args.out, env)
    if any(target.resolve() == Path(p).resolve() for p in args.files):
        raise ValueError(f"argument 'study': {target} is one of the files to merge")
    path = save_results(args.study, records, ceilings, args.out, env)
    print(f"wrote {path} ({len(records)} records from {len(parts)} files)")
    kinds = {
        "gconv-insitu": (report_insitu, plot_insitu),
        "gconv": (report_gconv, plot_gconv),
        "mlp": (report_mlp, plot_mlp),
    }
    prefix = next((k for k in kinds if args.study.startswith(k)), None)
    if prefix is not None:
        report, plot_fn = kinds[prefix]
        report(records, f"{args.study} ({device})")
        if args.plot:
            print(f"wrote {plot_fn(load_results(path), path.with_suffix('.png'))}")
    return 0
