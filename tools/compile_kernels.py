"""Compile every Triton kernel variant the GPU engine launches, for the GPU, on any machine.

    python3 tools/compile_kernels.py            # sm_90 and sm_80; exit 1 on the first error

Triton's interpreter (which runs the kernel tests without a GPU) is lenient
where the compiler is not: a name bound to a tensor in one branch and rebound
with another type in a later scope runs in the interpreter and fails to
compile (a GQA attention kernel once reached the H200 that way). This compiles
each variant ahead of time for sm_90 (the H200) and sm_80 (the lowest
capability nib supports) with the ptxas that ships in Triton's wheel. No GPU
is needed and nothing runs; tests/unit/test_kernels_compile.py calls it.
Must run without TRITON_INTERPRET (the test clears it).
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from nib.engine.kernels import decode_attention, gemv
from nib.engine.quant import fused_gemv

TARGETS = (GPUTarget("cuda", 90, 32), GPUTarget("cuda", 80, 32))


def compile_for(
    fn: Any, target: GPUTarget, types: dict[str, str], consts: dict[str, Any], warps: int
) -> None:
    names = fn.arg_names
    missing = [n for n in names if n not in types and n not in consts]
    if missing:
        raise ValueError(f"{fn.__name__}: give a type or a constant for {missing}")
    signature = {n: types.get(n, "constexpr") for n in names}
    constexprs = {(names.index(n),): v for n, v in consts.items()}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    options = {"num_warps": warps, "launch_pdl": bool(consts.get("PDL", False))}
    triton.compile(source, target=target, options=options)


def attention_variants() -> list[tuple[str, Any, dict[str, str], dict[str, Any], int]]:
    out = []
    shapes = ((32, 32, 64), (12, 2, 32), (32, 8, 64))  # MHA (Llama-2), GQA 6 (Qwen2.5), GQA 4
    for dtype, (heads, kv_heads, chunk) in itertools.product(("bf16", "fp16", "fp32"), shapes):
        types = {
            "Q": f"*{dtype}", "K": f"*{dtype}", "V": f"*{dtype}", "POS": "*i64",
            "O_PART": "*fp32", "ML_PART": "*fp32", "LOCK": "*i32", "OUT": f"*{dtype}",
            "S": "i32", "sm_scale": "fp32",
        }  # fmt: skip
        group = heads // kv_heads
        consts = dict(
            H=heads, KVH=kv_heads, GROUP=group, D=128, CHUNK=chunk, SPLITS=64,
            MERGE_BLOCK=64 // triton.next_power_of_2(group), GP=max(16, triton.next_power_of_2(group)),
            GM=triton.next_power_of_2(group), DYNAMIC=True,
        )  # fmt: skip
        name = f"decode_attention {dtype} heads={heads}/{kv_heads}"
        out.append((name, decode_attention._decode_attention_kernel, types, consts, 4))
    return out


def gemv_variants() -> list[tuple[str, Any, dict[str, str], dict[str, Any], int]]:
    out = []
    fusions = (
        ("plain", False, gemv.EPI_NONE, True),
        ("norm", True, gemv.EPI_NONE, True),
        ("norm_glu", True, gemv.EPI_GLU, False),
        ("residual", False, gemv.EPI_RESIDUAL, False),
    )
    for dtype, (label, norm, epilogue, bias), split, pdl in itertools.product(
        ("bf16", "fp32"), fusions, (1, 4), (False, True)
    ):
        types = {
            "X": f"*{dtype}", "W": f"*{dtype}", "B": f"*{dtype}", "Y": f"*{dtype}",
            "NW": f"*{dtype}", "WS": "*fp32", "LOCK": "*i32", "N": "i32", "stride_w": "i32",
            "eps": "fp32",
        }  # fmt: skip
        consts = dict(
            K=4096, HAS_BIAS=bias, NORM=norm, EPILOGUE=epilogue, BLOCK_N=8, BLOCK_K=512,
            SPLIT_K=split, PDL=pdl,
        )  # fmt: skip
        name = f"gemv {dtype} {label} split={split}{' pdl' if pdl else ''}"
        out.append((name, gemv._gemv_kernel, types, consts, 4))
    return out


def int4_gemv_variants() -> list[tuple[str, Any, dict[str, str], dict[str, Any], int]]:
    """The batch-1 INT4 GEMV (quant/fused_gemv.py), inline PTX included, per fusion."""
    out = []
    fusions = (
        ("plain", False, gemv.EPI_NONE, True, True),
        ("norm", True, gemv.EPI_NONE, True, False),
        ("norm_glu", True, gemv.EPI_GLU, False, False),
        ("residual", False, gemv.EPI_RESIDUAL, False, True),
    )
    for dtype, (label, norm, epilogue, bias, pairs), split in itertools.product(
        ("fp16", "bf16"), fusions, (1, 4)
    ):
        types = {
            "X": f"*{dtype}", "X32": "*i32" if pairs and dtype == "fp16" else f"*{dtype}",
            "QW": "*i32", "S": "*fp16", "B": "*fp16", "Y": f"*{dtype}", "NW": f"*{dtype}",
            "WS": "*fp32", "LOCK": "*i32", "N": "i32", "stride_s": "i32", "eps": "fp32",
        }  # fmt: skip
        consts = dict(
            K=4096, STEPS=8 // split, HAS_BIAS=bias, NORM=norm, EPILOGUE=epilogue,
            PAIRS=pairs and dtype == "fp16", BLOCK_N=16, GROUPS=4, SPLIT_K=split, USE_ASM=True,
            NORM_BLOCK=1024,
        )  # fmt: skip
        name = f"int4 gemv {dtype} {label} split={split}"
        out.append((name, fused_gemv.int4_gemv_kernel, types, consts, 4))
    return out


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_kernels: unset TRITON_INTERPRET (the interpreter compiles nothing)")
        return 2
    variants = attention_variants() + gemv_variants() + int4_gemv_variants()
    started = time.perf_counter()
    n = 0
    for target in TARGETS:
        for name, fn, types, consts, warps in variants:
            if consts.get("PDL") and target.arch < 90:
                continue  # programmatic dependent launch exists from sm_90 (gemv.pdl_launch)
            n += 1
            try:
                compile_for(fn, target, types, consts, warps)
            except Exception as e:  # report which variant, then fail
                print(f"FAILED sm_{target.arch} {name}: {type(e).__name__}: {e}")
                return 1
    print(f"compiled {n} kernel variants in {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
