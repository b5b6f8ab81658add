"""The TMA tile pipeline probe (``tilewise.bench.tma_copy``, ``scripts/tma_copy_probe.py``):
its configs refuse what the kernel cannot take, every default config compiles for sm_90a without
spills (nvcc, offline), and on a GPU each mode leaves ``y`` as it says on odd shapes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from tilewise.bench import sass
from tilewise.bench.tma_copy import MODES, TmaCopy, TmaCopyConfig, source
from tilewise.ops import gconv_cuda
from tilewise.runtime import tma

_SPEC = importlib.util.spec_from_file_location(
    "tma_copy_probe", Path(__file__).parents[1] / "scripts" / "tma_copy_probe.py"
)
probe = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(probe)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"mode": "sum"}, "mode"),
        ({"cb": 24}, "cb"),
        ({"halo": 1}, "halo"),
        ({"tw": 255, "halo": 2}, "halo"),
        ({"mode": "copy", "halo": 2}, "halo"),
        ({"stages": 1}, "stages"),
        ({"ctas": 0}, "ctas"),
    ],
)
def test_configs_refuse_what_the_kernel_cannot_take(kwargs, names):
    with pytest.raises(ValueError, match=names):
        TmaCopyConfig(**kwargs)


def test_probe_parses_configs_and_counts_bytes():
    cfg = probe.parse_config("staged,64,8,16,2,3,4")
    assert cfg == TmaCopyConfig(cb=64, th=8, tw=16, halo=2, stages=3, ctas=4, mode="staged")
    assert cfg.name == "staged_c64_8x16h2s3m4"
    assert cfg.load_bytes == 10 * 18 * 128 and cfg.staging_bytes == 8 * 16 * 128
    # stages and the staging tile each start on 1024 bytes, after 1024 bytes of slack
    assert cfg.smem_bytes() == 1024 + 3 * 23552 + 16384 + 24
    with pytest.raises(ValueError, match="configs"):
        probe.parse_config("staged,64,8,16,2,3")
    wide = probe.parse_config("staged,64,8,8,2,2,4,256")
    assert wide.threads == 256 and wide.name == "staged_c64_8x8h2s2m4t256"
    ldst = probe.parse_config("ldst,64,8,16,0,2,4")
    assert ldst.smem_bytes() == 1024 and ldst.staging_bytes == 0
    with pytest.raises(ValueError, match="halo"):
        probe.parse_config("ldst,64,8,16,2,2,4")
    with pytest.raises(ValueError, match="threads"):
        probe.parse_config("staged,64,8,8,2,2,4,100")
    with pytest.raises(ValueError, match="ctas"):  # 3 x 1024 threads do not fit an SM
        probe.parse_config("staged,64,8,8,2,2,3,1024")
    x = torch.empty(2, 64, 4, 4)
    assert probe.stream_bytes(cfg, x) == 2 * x.numel() * 4
    assert probe.stream_bytes(probe.parse_config("loads,32,8,16,2,2,4"), x) == x.numel() * 4


def test_default_configs_fit_their_ctas_on_a_hopper_sm():
    for text in probe.DEFAULT_CONFIGS:
        cfg = probe.parse_config(text)
        smem = gconv_cuda.pad_for_occupancy(cfg.smem_bytes(), cfg.ctas)
        assert cfg.ctas * (smem + gconv_cuda.SMEM_RESERVED) <= gconv_cuda.SMEM_SM, cfg.name
        # padded so that no CTA more fits, as the conv's capped launches
        assert (cfg.ctas + 1) * (smem + gconv_cuda.SMEM_RESERVED) > gconv_cuda.SMEM_SM, cfg.name


@pytest.mark.skipif(sass.NVCC is None, reason="nvcc is not installed")
def test_default_configs_compile_without_spills(tmp_path):
    seen = {}
    for text in probe.DEFAULT_CONFIGS:
        cfg = probe.parse_config(text)
        seen.setdefault(source(cfg), cfg)
    assert {c.mode for c in seen.values()} == set(MODES)
    for i, (src, cfg) in enumerate(seen.items()):
        out = tmp_path / str(i)
        out.mkdir()
        cubin, log = sass.compile_cubin(src, out)
        assert re.search(r"0 bytes spill stores, 0 bytes spill loads", log), (cfg.name, log)
        ops = sass.opcodes(cubin) if sass.cuobjdump() else []
        if ops:  # the pipeline's TMA loads and stores are there as the mode says
            tma_loads, tma_stores = ("copy", "staged", "loads"), ("copy", "staged", "stores")
            assert any(o.startswith("UTMALDG") for o in ops) == (cfg.mode in tma_loads), cfg.name
            assert any(o.startswith("UTMASTG") for o in ops) == (cfg.mode in tma_stores), cfg.name
            if cfg.mode == "ldst":  # 16-byte global loads and stores instead
                assert any(o.startswith("LDG.E.128") for o in ops), cfg.name
                assert any(o.startswith("STG.E.128") for o in ops), cfg.name


@pytest.mark.gpu
@pytest.mark.parametrize("text", probe.DEFAULT_CONFIGS)
def test_every_mode_leaves_y_as_it_says_on_odd_shapes(text):
    cfg = probe.parse_config(text)
    if not tma.supported(0):
        pytest.skip("needs the TMA unit (compute capability 9.0)")
    # odd edges with one tile a CTA, and many tiles a CTA (the stages' reuse, the mbarriers'
    # parity flips, the staging tile's reuse) with tiles cut at the edges
    for shape in [(3, 64, 13, 21), (1, 128, 7, 70), (64, 64, 37, 45)]:
        x = torch.randn(shape, device="cuda", dtype=torch.float16)
        x = x.to(memory_format=torch.channels_last)
        y = torch.empty_like(x)
        probe.check(TmaCopy(cfg, x, y), cfg, x, y)
