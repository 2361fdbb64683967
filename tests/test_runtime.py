"""The process settings the `unmask` command applies: the kernel caches are capped with --bf16 or --int8, before torch
loads, and a user's own setting wins."""

from __future__ import annotations

import os
import subprocess
import sys

SHOW = ("import os, sys; from unmask.cli import main; main(sys.argv[1:]); "
        "print(os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'), os.environ.get('LRU_CACHE_CAPACITY'))")


def caches_after(*argv: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.endswith("CACHE_CAPACITY")}
    done = subprocess.run([sys.executable, "-c", SHOW, *argv], capture_output=True, text=True,
                          env={**clean, **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_bf16_commands_cap_the_kernel_caches(model_dirs):
    assert caches_after("fill-mask", str(model_dirs["fill-mask"]), "a [MASK]", "--bf16") == "64 64"
    assert caches_after("fill-mask", str(model_dirs["fill-mask"]), "a [MASK]") == "None None"  # fp32: untouched
    assert caches_after("fill-mask", str(model_dirs["fill-mask"]), "a [MASK]", "--bf16",
                        LRU_CACHE_CAPACITY="8") == "64 8"


def test_int8_commands_cap_the_kernel_caches(model_dirs):  # oneDNN's int8 kernels on AMX: one per token count
    assert caches_after("fill-mask", str(model_dirs["fill-mask"]), "a [MASK]", "--int8") == "64 64"
