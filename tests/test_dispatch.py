"""Dispatch: one place decides kernel vs reference; a fallback is logged once with why."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tilewise.runtime import dispatch


def test_fallback_logged_once(caplog):
    dispatch._log_once.cache_clear()
    with caplog.at_level("WARNING", logger="tilewise"):
        for _ in range(3):
            assert dispatch.use_kernel("demo_op", [torch.zeros(2, dtype=torch.float64)]) is False
    msgs = [r.getMessage() for r in caplog.records if "demo_op" in r.getMessage()]
    assert len(msgs) == 1 and "float64" in msgs[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="GPU runs do not use the interpreter")
def test_bf16_on_interpreter_uses_reference():
    assert dispatch.use_kernel("demo_bf16", [torch.zeros(2, dtype=torch.bfloat16)]) is False


def test_device_and_dtype_checks_name_arguments():
    a = torch.zeros(2)
    with pytest.raises(ValueError, match="'b'"):
        dispatch.check_same_device("op", a=a, b=torch.zeros(2, device="meta"))
    with pytest.raises(ValueError, match="'b'"):
        dispatch.check_same_dtype("op", a=a, b=torch.zeros(2, dtype=torch.float16))
    with pytest.raises(ValueError, match="'w'"):
        dispatch.check_param_dtype("op", a, w=torch.zeros(2, dtype=torch.float64))
    dispatch.check_param_dtype("op", a.half(), w=torch.zeros(2))  # fp32 params are allowed


def test_cpu_without_interpreter_runs_reference_and_says_why():
    """A model built on tilewise runs anywhere: on CPU without the interpreter, references run."""
    code = (
        "import logging, torch, tilewise\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "x = torch.randn(4, 8); b = torch.randn(8)\n"
        "for _ in range(2): y = tilewise.bias_act(x, b, 'gelu')\n"
        "torch.testing.assert_close(y, torch.nn.functional.gelu(x + b))\n"
        "z = tilewise.layer_norm(x, 8)\n"
        "torch.testing.assert_close(z, torch.nn.functional.layer_norm(x, (8,)))\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    fallbacks = [ln for ln in out.stderr.splitlines() if "falling back" in ln]
    assert len(fallbacks) == 2, out.stderr  # one line per op, not per call
    assert all("TRITON_INTERPRET" in ln for ln in fallbacks)
