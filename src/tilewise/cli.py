"""``tilewise`` command line: ``bench ceilings``, ``bench pointwise``, ``bench gconv``,
``bench gconv-insitu``, ``bench mlp`` (alias ``mlp-bench``), ``bench report``, ``bench merge``,
``bench gconv-bars``, ``bench mlp-targets`` (those in ``bench.reports``), ``cache`` and ``tour``.

Everything printed is measured in the same run. Without a CUDA GPU the GPU studies refuse to
run (exit code 2); ``tour`` then runs small CPU agreement checks instead and says so.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tilewise.bench import reports
from tilewise.registry import DTYPES, OPS, RowsProblem

if TYPE_CHECKING:
    from tilewise.bench.gconv import GConvStudyConfig
    from tilewise.bench.gconv_insitu import InSituConfig
    from tilewise.bench.mlp import MLPConfig
    from tilewise.bench.pointwise import PointwiseConfig

DEFAULT_OUT = Path("benchmarks/results")
NO_GPU = "No CUDA GPU: GPU figures need a GPU; running small CPU checks"
CPU_SHAPE = (256, 512)


def _needs_cuda(what: str) -> bool:
    if torch.cuda.is_available():
        return True
    print(
        f"tilewise {what}: needs a CUDA GPU (torch.cuda.is_available() is False); "
        "nothing was measured. Run `tilewise tour` for CPU checks.",
        file=sys.stderr,
    )
    return False


# --- bench ceilings ------------------------------------------------------------------------------


def _cmd_ceilings(args: argparse.Namespace) -> int:
    from tilewise.bench.ceilings import format_ceilings, measure_ceilings
    from tilewise.bench.results import save_results

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print("No CUDA GPU: measuring CPU ceilings at small sizes (labelled cpu)")
    c = measure_ceilings(device, dtypes=tuple(args.dtypes))
    print(format_ceilings(c))
    path = save_results("ceilings", [], c, args.out)
    print(f"wrote {path}")
    return 0


# --- bench pointwise -----------------------------------------------------------------------------


def add_pointwise_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of the pointwise study (shared with ``benchmarks/bench_pointwise.py``)."""
    p.add_argument("--quick", action="store_true", help="one n per op, 4 and 64 MB, fp16 only")
    p.add_argument("--ops", nargs="+", choices=sorted(OPS), help="ops to measure (default: all)")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), help="dtypes to measure")
    p.add_argument("--sizes-mb", nargs="+", type=float, help="tensor sizes in MB (2**20 bytes)")
    p.add_argument("--n", nargs="+", type=int, help="row lengths (default: per-op list)")
    p.add_argument("--impls", nargs="+", choices=["tilewise", "eager", "compile"])
    p.add_argument("--passes", nargs="+", choices=["fwd", "bwd"])
    p.add_argument("--warmup", type=int, help="untimed calls per measurement")
    p.add_argument("--reps", type=int, help="timed calls per measurement")
    _common_study_args(p, "pointwise")
    return p


def _with_overrides(base, overrides: dict):
    """``replace(base, ...)`` with the options that were given (lists become tuples)."""
    return replace(
        base,
        **{
            k: (tuple(v) if isinstance(v, list) else v)
            for k, v in overrides.items()
            if v is not None
        },
    )


def pointwise_config(args: argparse.Namespace) -> PointwiseConfig:
    """A ``PointwiseConfig`` from parsed options (``--quick`` first, explicit options on top)."""
    from tilewise.bench.pointwise import PointwiseConfig

    base = PointwiseConfig.quick() if args.quick else PointwiseConfig()
    overrides = {
        "ops": args.ops,
        "dtypes": args.dtypes,
        "sizes_mb": args.sizes_mb,
        "n_values": args.n,
        "impls": args.impls,
        "passes": args.passes,
        "warmup": args.warmup,
        "reps": args.reps,
    }
    return _with_overrides(base, overrides)


def _save(study: str, records: list[dict], ceilings, out: Path, plot: bool, plot_fn=None) -> None:
    """Write the JSON; with ``plot``, a PNG beside it drawn by ``plot_fn(results, path)``
    (default: fraction of copy vs size, for records that have ``frac_copy``)."""
    from tilewise.bench.results import load_results, save_results

    path = save_results(study, records, ceilings, out)
    print(f"wrote {path}")
    if plot_fn is None and plot and any(r.get("frac_copy") is not None for r in records):
        from tilewise.bench.plots import plot_fraction_of_copy as plot_fn
    if plot and plot_fn is not None:
        try:
            png = plot_fn(load_results(path), path.with_suffix(".png"))
        except ValueError as exc:  # nothing timed: say so instead of failing the run
            print(f"no plot: {exc}")
        else:
            print(f"wrote {png}")


def _run_study(
    args: argparse.Namespace,
    name: str,
    run,
    report,
    title: str,
    study: str,
    plot_fn=None,
    dtypes: tuple[str, ...] = tuple(DTYPES),
) -> int:
    """Ceilings, ``run(config-bound: ceilings) -> records``, ``report``, then JSON (and PNG)."""
    if not _needs_cuda(f"bench {name}"):
        return 2
    from tilewise.bench.ceilings import format_ceilings, measure_ceilings
    from tilewise.bench.grid import checkpointing

    ceilings = measure_ceilings("cuda", dtypes=dtypes)
    print(format_ceilings(ceilings))
    t0 = time.perf_counter()
    from tilewise.bench.results import environment, result_path, save_results

    # after each problem, the records so far in <study>.partial__<device>.json (a results file
    # ``merge`` and ``report`` read), removed once the whole file is written
    env, partial = environment(), f"{study}.partial"
    with checkpointing(lambda recs: save_results(partial, recs, ceilings, args.out, env)):
        records = run(ceilings)
    report(records, f"{title}, {time.perf_counter() - t0:.0f} s")
    _save(study, records, ceilings, args.out, args.plot, plot_fn)
    result_path(partial, args.out, env).unlink(missing_ok=True)
    return 0


def run_pointwise_command(args: argparse.Namespace) -> int:
    """``tilewise bench pointwise``: ceilings, the grid, a summary table, JSON (and PNG)."""
    from tilewise.bench.pointwise import run_pointwise

    config = pointwise_config(args)
    return _run_study(
        args,
        "pointwise",
        lambda ceilings: run_pointwise(config, ceilings, "cuda", progress=not args.no_progress),
        reports.report_pointwise,
        "pointwise study",
        args.study,
    )


# --- bench gconv (isolated) and bench gconv-insitu -----------------------------------------------


def _common_study_args(p: argparse.ArgumentParser, study: str) -> None:
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for JSON/PNG")
    p.add_argument("--study", default=study, help=f"result file prefix (default: {study})")
    p.add_argument("--plot", action="store_true", help="also write a PNG figure")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def gconv_shape(text: str) -> tuple[int, int, int]:
    """``C:HxW`` (e.g. ``1024:16x16``) as ``(C, H, W)``; C a positive multiple of 8."""
    try:
        c, hw = text.split(":")
        h, w = hw.lower().split("x")
        shape = (int(c), int(h), int(w))
    except ValueError:
        msg = f"expected C:HxW such as 1024:16x16, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if min(shape) < 1 or shape[0] % 8:
        raise argparse.ArgumentTypeError(
            f"C must be a positive multiple of 8, H and W >= 1: {text!r}"
        )
    return shape


def add_gconv_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of the isolated grouped-conv study (shared with ``benchmarks/bench_gconv.py``)."""
    p.add_argument("--quick", action="store_true", help="fp16, C=64 64x64 3x3, N in {1, 32}")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), help="default: fp16 bf16")
    p.add_argument("--n", nargs="+", type=int, help="batch sizes (default: 1 8 32 64 128 256)")
    p.add_argument(
        "--channels",
        nargs="+",
        type=int,
        choices=[64, 128, 256],
        help="only the shapes of these channel counts (C=64 64x64, C=128 32x32, C=256 16x16)",
    )
    p.add_argument(
        "--shapes",
        nargs="+",
        type=gconv_shape,
        metavar="C:HxW",
        help="the shapes instead of the three above, e.g. 1024:16x16 (MBConv's grouped conv)",
    )
    p.add_argument("--kernels", nargs="+", type=int, help="kernel sizes at every shape (3)")
    p.add_argument(
        "--extra-kernels", nargs="*", type=int, help="kernel sizes at C=64 64x64 only (5 7)"
    )
    p.add_argument("--passes", nargs="+", choices=["fprop", "dgrad", "wgrad"])
    p.add_argument("--impls", nargs="+", choices=["tilewise", "cudnn"])
    p.add_argument("--warmup", type=int, help="untimed calls per measurement")
    p.add_argument("--reps", type=int, help="timed calls per measurement")
    p.add_argument(
        "--tilewise-weight",
        choices=["channels_last", "contiguous"],
        help="the weight layout tilewise gets (default channels_last, as cuDNN and a "
        "channels_last model; contiguous: sessions 1-20)",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        default=None,
        help="tilewise's deterministic backward (wgrad without atomics; cuDNN as it is)",
    )
    _common_study_args(p, "gconv")
    return p


def gconv_config(args: argparse.Namespace) -> GConvStudyConfig:
    """A ``GConvStudyConfig`` from parsed options (``--quick`` first, options on top)."""
    from tilewise.bench.gconv import GConvStudyConfig

    base = GConvStudyConfig.quick() if args.quick else GConvStudyConfig()
    shapes = extra = None
    if args.shapes:
        shapes = tuple(dict.fromkeys(args.shapes))
        if base.extra_shape not in shapes:
            extra = ()  # the extra kernel sizes run at C=64 64x64 only
    if args.channels:
        shapes = tuple(s for s in shapes or base.shapes if s[0] in args.channels)
        if base.extra_shape[0] not in args.channels:
            extra = ()
    overrides = {
        "shapes": shapes,
        "dtypes": args.dtypes,
        "batches": args.n,
        "kernels": args.kernels,
        "extra_kernels": extra if extra is not None else args.extra_kernels,
        "passes": args.passes,
        "impls": args.impls,
        "warmup": args.warmup,
        "reps": args.reps,
        "tilewise_weight": args.tilewise_weight,
        "deterministic": args.deterministic,
    }
    config = _with_overrides(base, overrides)
    if not config.problems():
        raise SystemExit(
            "tilewise bench gconv: --channels (with --quick: 64) or --shapes leaves no problem"
        )
    return config


def run_gconv_command(args: argparse.Namespace) -> int:
    """``tilewise bench gconv``: ceilings, the isolated grid, a table, JSON (and PNG)."""
    from tilewise.bench.gconv import plot_gconv, run_gconv

    config = gconv_config(args)
    return _run_study(
        args,
        "gconv",
        lambda ceilings: run_gconv(config, ceilings, "cuda", progress=not args.no_progress),
        reports.report_gconv,
        "grouped conv, isolated",
        args.study,
        plot_gconv,
        ("fp16", "bf16"),
    )


def add_insitu_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of the in-situ study (shared with ``benchmarks/bench_gconv_insitu.py``)."""
    p.add_argument("--quick", action="store_true", help="both blocks at batch 32 and 64")
    p.add_argument("--blocks", nargs="+", choices=["convfirst", "mbconv"])
    p.add_argument("--batches", nargs="+", type=int, help="default: 32 64 ... 256")
    p.add_argument(
        "--impls", nargs="+", choices=["tilewise", "eager", "compile", "tilewise-compile"]
    )
    p.add_argument("--depth", type=int, help="blocks in the stack (default 4, plus 2 extra)")
    p.add_argument("--iters", type=int, help="profiled forward + backward iterations")
    p.add_argument("--reps", type=int, help="timed training steps")
    _common_study_args(p, "gconv-insitu")
    return p


def insitu_config(args: argparse.Namespace) -> InSituConfig:
    """An ``InSituConfig`` from parsed options (``--quick`` first, options on top)."""
    from tilewise.bench.gconv_insitu import InSituConfig

    base = InSituConfig.quick() if args.quick else InSituConfig()
    overrides = {
        "blocks": args.blocks,
        "batches": args.batches,
        "impls": args.impls,
        "depth": args.depth,
        "iters": args.iters,
        "step_reps": args.reps,
    }
    return _with_overrides(base, overrides)


def run_insitu_command(args: argparse.Namespace) -> int:
    """``tilewise bench gconv-insitu``: ceilings, the block stacks, tables, JSON (and PNG)."""
    from tilewise.bench.gconv_insitu import plot_insitu, run_insitu

    config = insitu_config(args)
    return _run_study(
        args,
        "gconv-insitu",
        lambda ceilings: run_insitu(config, ceilings, "cuda", progress=not args.no_progress),
        reports.report_insitu,
        "grouped conv in situ",
        args.study,
        plot_insitu,
        ("fp16",),
    )


# --- bench mlp (alias: mlp-bench) ----------------------------------------------------------------


def add_mlp_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of the MLP study (shared with ``benchmarks/bench_mlp.py``)."""
    p.add_argument(
        "--quick", action="store_true", help="layers 1 8, batch 2 64 512, hidden 256 1024 4096"
    )
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), help="default: fp32 fp16 bf16")
    p.add_argument("--layers", nargs="+", type=int, help="default: 1 2 4 8")
    p.add_argument("--batches", nargs="+", type=int, help="default: 2 4 ... 128 512 4096")
    p.add_argument("--hiddens", nargs="+", type=int, help="default: 128 ... 4096 8192")
    p.add_argument(
        "--impls", nargs="+", choices=["eager", "graph", "compile", "tilewise", "strassen"]
    )
    p.add_argument(
        "--no-compile", action="store_true", help="leave out torch.compile (slow to build)"
    )
    p.add_argument(
        "--no-train", action="store_true", help="leave out the training-step measurement"
    )
    p.add_argument("--warmup", type=int, help="untimed calls per measurement")
    p.add_argument("--reps", type=int, help="timed calls (or graph replays) per measurement")
    p.add_argument(
        "--no-isolate",
        action="store_true",
        help="time every cell in this process (default with torch.compile: each cell in a "
        "worker process, so a CUDA fault costs one cell, not the study)",
    )
    p.add_argument(
        "--compile-warm-jobs",
        type=int,
        default=0,
        metavar="N",
        help="first build every cell's torch.compile model in N processes (inductor's on-disk "
        "caches), so the study finds them built (max-autotune: ~30 s a shape alone)",
    )
    _common_study_args(p, "mlp")
    return p


def mlp_config(args: argparse.Namespace) -> MLPConfig:
    """An ``MLPConfig`` from parsed options (``--quick`` first, options on top)."""
    from tilewise.bench.mlp import MLPConfig

    base = MLPConfig.quick() if args.quick else MLPConfig.full()
    overrides = {
        "dtypes": args.dtypes,
        "layers": args.layers,
        "batches": args.batches,
        "hiddens": args.hiddens,
        "impls": args.impls,
        "warmup": args.warmup,
        "reps": args.reps,
    }
    cfg = _with_overrides(base, overrides)
    if args.no_compile:
        cfg = replace(cfg, impls=tuple(i for i in cfg.impls if i != "compile"))
    if getattr(args, "no_isolate", False):
        cfg = replace(cfg, isolate=False)
    return replace(cfg, train=False) if args.no_train else cfg


def run_mlp_command(args: argparse.Namespace) -> int:
    """``tilewise bench mlp`` / ``tilewise mlp-bench``: ceilings, the grid, tables, JSON (PNGs)."""
    from tilewise.bench.mlp import plot_mlp, run_mlp, warm_compile

    config = mlp_config(args)
    if args.compile_warm_jobs > 0 and "compile" in config.impls:
        if not torch.cuda.is_available():
            raise SystemExit("tilewise bench mlp: --compile-warm-jobs needs a CUDA device")
        t0 = time.perf_counter()
        built = warm_compile(config, args.compile_warm_jobs)
        failed = [f"{c}: {r}" for c, r in built if isinstance(r, str)]
        secs = sorted(r for _, r in built if not isinstance(r, str))
        median = f"{secs[len(secs) // 2]:.1f} s" if secs else "-"
        print(
            f"compile warm-up: {len(secs)} of {len(built)} cells built in "
            f"{time.perf_counter() - t0:.0f} s by {args.compile_warm_jobs} processes "
            f"(median {median} a cell)"
        )
        for line in failed[:10]:
            print(f"  not built: {line}")

    def plot(results, path):
        png = plot_mlp(results, path)
        graph_png = png.with_name(png.stem + "-vs-graph.png")
        if graph_png.exists():
            print(f"wrote {graph_png}")
        return png

    return _run_study(
        args,
        "mlp",
        lambda ceilings: run_mlp(config, ceilings, None, progress=not args.no_progress),
        reports.report_mlp,
        "MLP grid (seed 001)",
        args.study,
        plot,
        config.dtypes,
    )


# --- tour ----------------------------------------------------------------------------------------


def _tour_gpu(args: argparse.Namespace) -> int:
    from tilewise.bench.ceilings import format_ceilings, measure_ceilings
    from tilewise.bench.pointwise import PointwiseConfig, run_pointwise

    ceilings = measure_ceilings("cuda")
    print(format_ceilings(ceilings))
    config = PointwiseConfig.tour()
    records = run_pointwise(config, ceilings, "cuda", progress=not args.no_progress)
    reports.report_pointwise(
        records, "tilewise vs eager PyTorch vs torch.compile (fp16, bf16; 64 and 256 MB)"
    )
    if args.out is not None:
        _save("tour", records, ceilings, args.out, plot=True)
    return 0 if _tour_models(torch.device("cuda")) else 1


def _tour_models(device: torch.device) -> bool:
    """Whole training steps (MLP, ConvFirst stack), tilewise vs eager; True if all agree."""
    from tilewise.bench import tour
    from tilewise.bench.results import format_table

    records = tour.rows(device)
    print("\nTraining steps from the same weights (median wall time per step, host included):")
    print(format_table(*tour.format_rows(records)))
    return all(r["agrees"] for r in records)


def _tour_cpu(args: argparse.Namespace) -> int:
    from tilewise.bench.ceilings import format_ceilings, measure_ceilings
    from tilewise.bench.pointwise import BASE_ACTIVATIONS, Case, measure_case
    from tilewise.bench.results import format_table
    from tilewise.runtime import dispatch

    print(NO_GPU)
    ceilings = measure_ceilings("cpu", dtypes=("fp32",))
    print(format_ceilings(ceilings))
    m, n = CPU_SHAPE
    reps = 3 if dispatch.INTERPRET else 5  # the interpreter takes ~0.1 s per call here
    rows, all_ok = [], True
    for op in OPS:
        for dtype in ("fp32", "fp16"):
            for act in BASE_ACTIVATIONS.get(op, (RowsProblem(1, 1).activation,)):
                problem = RowsProblem(m, n, dtype, act)
                case = Case(op, problem, problem.tensor_bytes / (1 << 20))
                recs = measure_case(
                    case,
                    ("tilewise", "eager"),
                    ceilings=ceilings,
                    device="cpu",
                    warmup=1,
                    reps=reps,
                )
                kernel = dispatch.INTERPRET and dtype != "bf16"
                path = "triton interpreter" if kernel else "torch reference"
                by = {(r["pass"], r["impl"]): r for r in recs}
                for pass_ in ("fwd", "bwd"):
                    tw, ea = by.get((pass_, "tilewise")), by.get((pass_, "eager"))
                    if tw is None or ea is None:
                        continue
                    all_ok &= bool(tw["checked"]) and tw["median_s"] is not None
                    rows.append(
                        [
                            op,
                            pass_,
                            dtype,
                            act,
                            f"{m}x{n}",
                            path,
                            "yes" if tw["checked"] else "NO",
                            _ms(tw["median_s"]),
                            _ms(ea["median_s"]),
                            _frac(tw.get("frac_copy")),
                            _frac(ea.get("frac_copy")),
                        ]
                    )
    headers = [
        "op",
        "pass",
        "dtype",
        "act",
        "shape",
        "tilewise runs",
        "agrees",
        "tilewise ms",
        "eager ms",
        "tw frac",
        "eager frac",
    ]
    print("\nCPU checks (perf_counter; frac = effective bandwidth / CPU copy bandwidth):")
    print(format_table(headers, rows))
    if not dispatch.INTERPRET:
        print(
            "\nOn a CPU tilewise runs its PyTorch reference unless TRITON_INTERPRET=1 was set "
            "before import; the kernels and the GPU figures need a CUDA GPU."
        )
    all_ok &= _tour_models(torch.device("cpu"))
    if not all_ok:
        print("Some tilewise results disagree with eager PyTorch (see 'agrees').")
    return 0 if all_ok else 1


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f}"


def _frac(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _cmd_cache(args: argparse.Namespace) -> int:
    """``tilewise cache export PATH`` / ``tilewise cache import PATH``: ship kernel-config choices
    (the autotune cache, keyed by device, problem, dtype and versions) to another machine, so its
    first run times nothing it already knows. ``tilewise cache info``: where the caches are and
    what they hold; ``tilewise cache clear-binaries``: remove the compiled NVRTC kernels (they
    are compiled again when next used)."""
    from tilewise.runtime import autotune, nvrtc_cache

    if args.action in ("export", "import") and args.path is None:
        raise SystemExit(f"tilewise cache {args.action}: needs a PATH")
    if args.action == "info":
        entries = autotune._read(autotune.cache_path())
        files, size = nvrtc_cache.binaries(), nvrtc_cache.total_bytes()
        print(f"autotune choices: {len(entries)} in {autotune.cache_path()}")
        print(
            f"NVRTC binaries: {len(files)}, {size / 2**20:.1f} MiB in {nvrtc_cache.binaries_dir()}"
            f" (kept: {'yes' if nvrtc_cache.enabled() else 'no'};"
            f" cap {nvrtc_cache.max_bytes() / 2**20:.0f} MiB)"
        )
    elif args.action == "clear-binaries":
        count = nvrtc_cache.clear()
        print(f"removed {count} NVRTC binaries from {nvrtc_cache.binaries_dir()}")
    elif args.action == "export":
        count = autotune.export_cache(args.path)
        print(f"exported {count} choices from {autotune.cache_path()} to {args.path}")
    else:
        count = autotune.import_cache(args.path)
        print(f"imported {count} choices from {args.path} into {autotune.cache_path()}")
    return 0


def _cmd_tour(args: argparse.Namespace) -> int:
    return _tour_gpu(args) if torch.cuda.is_available() else _tour_cpu(args)


# --- entry point ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tilewise", description="tilewise benchmarks and tour")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run a benchmark study")
    studies = bench.add_subparsers(dest="study", required=True)
    ceil = studies.add_parser("ceilings", help="copy bandwidth and matmul rates of this device")
    ceil.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    ceil.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for the JSON")
    ceil.set_defaults(func=_cmd_ceilings)
    pw = add_pointwise_args(studies.add_parser("pointwise", help="pointwise ops study"))
    pw.set_defaults(func=run_pointwise_command)
    gc = add_gconv_args(studies.add_parser("gconv", help="grouped conv, isolated kernels"))
    gc.set_defaults(func=run_gconv_command)
    gi = add_insitu_args(studies.add_parser("gconv-insitu", help="grouped conv in block stacks"))
    gi.set_defaults(func=run_insitu_command)
    ml = add_mlp_args(studies.add_parser("mlp", help="seed 001's MLP grid + a training step"))
    ml.set_defaults(func=run_mlp_command)
    rep = studies.add_parser("report", help="summary tables of saved results in a directory")
    rep.add_argument("dir", type=Path)
    rep.set_defaults(func=reports.cmd_report)
    bars = studies.add_parser("gconv-bars", help="issue 3's bars judged on gconv result files")
    bars.add_argument("files", nargs="+", type=Path)
    bars.add_argument(
        "--bar-only", action="store_true", help="only the readings at >= 64 MB of activations"
    )
    bars.set_defaults(func=reports.cmd_gconv_bars)
    targets = studies.add_parser("mlp-targets", help="issue 4's targets judged on mlp result files")
    targets.add_argument("files", nargs="+", type=Path)
    targets.add_argument("--all", action="store_true", help="every judged cell, not only misses")
    targets.set_defaults(func=reports.cmd_mlp_targets)
    merge = studies.add_parser("merge", help="join result files of a study run in parts")
    merge.add_argument("study", help="name of the merged study (its prefix picks table and plot)")
    merge.add_argument("files", nargs="+", type=Path)
    merge.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for JSON/PNG")
    merge.add_argument("--plot", action="store_true", help="also write a PNG figure")
    merge.add_argument(
        "--unique-by",
        nargs="+",
        metavar="FIELD",
        help="keep one record per value of these fields, the one from the latest file "
        "(e.g. dtype layers batch hidden impl: a cell re-run in a later part replaces it)",
    )
    merge.set_defaults(func=reports.cmd_merge)
    alias = add_mlp_args(sub.add_parser("mlp-bench", help="same as `tilewise bench mlp`"))
    alias.set_defaults(func=run_mlp_command)
    cache = sub.add_parser(
        "cache", help="export or import the kernel-config (autotune) cache; info; clear-binaries"
    )
    cache.add_argument("action", choices=["export", "import", "info", "clear-binaries"])
    cache.add_argument("path", type=Path, nargs="?", help="the shipped cache file (export, import)")
    cache.set_defaults(func=_cmd_cache)
    tour = sub.add_parser("tour", help="ceilings + tilewise vs eager vs torch.compile")
    tour.add_argument("--out", type=Path, default=None, help="also write JSON/PNG here")
    tour.add_argument("--no-progress", action="store_true", help="no progress bar")
    tour.set_defaults(func=_cmd_tour)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tilewise`` script; returns the exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
