"""Registers and spills of tilewise's pointwise backward Triton kernels at their default configs
for 64 MB fp16 problems, compiled offline for sm_90a (no GPU needed): Triton's PTX through
``ptxas -v``. Occupancy follows: 65536 registers per SM / (registers x threads per program) is
how many of the ``progs_per_sm`` programs the grid assumes can actually be resident.

    python scripts/triton_regs.py [--ptxas /usr/local/cuda/bin/ptxas]

Every pointer and integer argument is compiled as a multiple of 16, as the JIT specializes them
at the study shapes. Session 9's figures (246-255 registers for bias_act bwd, spills at n = 64)
were taken without that hint, i.e. for a kernel with 2-byte loads that the GPU never runs;
session 10 added it (see docs/PERF_NOTES.md for the corrected figures).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tilewise.ops import bias_act, layernorm
from tilewise.ops._common import activation_code

MB64 = 64 * 2**20


def ptxas_report(jit, types: dict, consts: dict, warps: int, ptxas: str) -> str:
    """``ptxas -v``'s register and spill lines for ``jit`` specialised to ``consts``."""
    sig, const_idx = {}, {}
    for i, name in enumerate(jit.arg_names):
        if name in consts:
            sig[name], const_idx[(i,)] = "constexpr", consts[name]
        else:
            sig[name] = types.get(name, "i32")
    # the JIT specializes pointers and integers that are multiples of 16 (every study shape's
    # are): without that hint Triton cannot prove contiguity and emits 2-byte loads, and the
    # register counts read here are not the GPU's (session 9's were taken that way)
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(jit.arg_names)
        if name not in consts and not sig[name].startswith("fp")
    }
    src = ASTSource(fn=jit, signature=sig, constexprs=const_idx, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ptx = re.sub(r"\.version \d+\.\d+", ".version 8.4", kernel.asm["ptx"])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        out = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", "-o", str(Path(tmp) / "k.cubin"), str(path)],
            capture_output=True,
            text=True,
        )
    keep = [ln.split(":", 1)[-1].strip() for ln in out.stderr.splitlines()]
    return " | ".join(ln for ln in keep if "registers" in ln or "spill" in ln or "rror" in ln)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ptxas", default="/usr/local/cuda/bin/ptxas")
    args = ap.parse_args()
    half = "*fp16"
    for n in (1024, 4096):
        m = MB64 // (n * 2)
        cfg = layernorm._config("layer_norm_bwd", m, n, 2, None)
        ptrs = ("dy_ptr", "x_ptr", "w_ptr", "b_ptr", "dx_ptr", "dw_ptr", "db_ptr")
        types = {p: half for p in ptrs}
        types.update(mean_ptr="*fp32", rstd_ptr="*fp32", dwp_ptr="*fp32", dbp_ptr="*fp32")
        types.update(count_ptr="*i32")
        for relu in (False, True):
            consts = dict(HAS_W=True, HAS_B=True, RELU=relu, ATOMIC=True, SLOTS=8,
                          PREFETCH=False, STAGES=cfg.stages, BLOCK_M=cfg.block_m,
                          BLOCK_N=cfg.block_n, STREAM=cfg.streaming)  # fmt: skip
            kern = layernorm._ln_bwd_kernel
            report = ptxas_report(kern, types, consts, cfg.num_warps, args.ptxas)
            print(f"layer_norm bwd n={n} relu={relu} {cfg}: {report}", flush=True)
    for m, n in ((8192, 4096), (524288, 64)):
        types = dict(dy_ptr=half, x_ptr=half, b_ptr=half, dx_ptr=half, db_ptr=half)
        types.update(dbp_ptr="*fp32", count_ptr="*i32")
        for act in ("relu", "gelu", "silu"):
            cfg = bias_act._config("bias_act_bwd", m, n, 2, None, act)  # GELU/SiLU: own tiles
            consts = dict(HAS_BIAS=True, ADD_BIAS=True, ACT=activation_code(act), FAST_ACT=True,
                          ATOMIC=True, SLOTS=8, PREFETCH=False, STAGES=cfg.stages,
                          BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                          STREAM=cfg.streaming)  # fmt: skip
            report = ptxas_report(
                bias_act._bias_act_bwd_kernel, types, consts, cfg.num_warps, args.ptxas
            )
            print(f"bias_act bwd {m}x{n} {act} {cfg}: {report}", flush=True)
    for m, n in ((8192, 4096), (524288, 64)):
        cfg = bias_act._config("bias_act_fwd", m, n, 2, None)
        types = dict(x_ptr=half, b_ptr=half, y_ptr=half)
        for act in ("relu", "gelu", "silu"):
            consts = dict(HAS_BIAS=True, ACT=activation_code(act), FAST_ACT=True, STREAM=False,
                          STAGES=cfg.stages,
                          BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)  # fmt: skip
            report = ptxas_report(
                bias_act._bias_act_fwd_kernel, types, consts, cfg.num_warps, args.ptxas
            )
            print(f"bias_act fwd {m}x{n} {act} {cfg}: {report}", flush=True)


if __name__ == "__main__":
    main()
