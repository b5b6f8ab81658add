"""The read-only stream kernel (``tilewise.bench.streams``): every element summed once, per
program; bad input raises. Runs through the Triton interpreter on the CPU (``scripts/test.sh``
sets ``TRITON_INTERPRET=1``); nothing asserts on a timing."""

from __future__ import annotations

import math
import os

import pytest
import torch

from tilewise.bench import streams

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs a GPU or the Triton interpreter",
)


@pytest.mark.parametrize("numel", [1, 4095, streams.READ_BLOCK * streams.READ_STEPS + 37])
def test_read_sum_reads_every_element_once(numel):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randint(-1000, 1000, (numel,), dtype=torch.int32, device=dev)
    span = streams.READ_BLOCK * streams.READ_STEPS
    out = torch.full((math.ceil(numel / span),), 12345, dtype=torch.int32, device=dev)  # poison
    streams.read_sum(x, out)
    pad = torch.zeros(out.numel() * span - numel, dtype=torch.int64, device=dev)
    ref = torch.cat([x.long(), pad]).view(-1, span).sum(dim=1)
    assert torch.equal(out.long(), ref)


def test_read_sum_rejects_bad_input():
    x = torch.zeros(16, dtype=torch.float32)
    with pytest.raises(ValueError, match="'x'"):
        streams.read_sum(x)
    with pytest.raises(ValueError, match="'out'"):
        streams.read_sum(x.int(), torch.zeros(5, dtype=torch.int32))


def test_measure_stream_bandwidth_reports_three_streams():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    bw = streams.measure_stream_bandwidth(dev, nbytes=1 << 16, warmup=1, reps=2)
    assert set(bw) == {"read_bytes_per_s", "write_bytes_per_s", "copy_bytes_per_s"}
    assert all(math.isfinite(v) and v > 0 for v in bw.values())
