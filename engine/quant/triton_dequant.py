"""Triton building blocks shared by the INT4 kernels: turning packed words into fp16.

Every helper works on int32 words in layout.py's interleaved nibble order and
uses the 1024.0-mantissa trick: OR a nibble c into the mantissa of fp16 1024.0
(0x6400) and the bits read as the fp16 number 1024 + c, so one AND/OR turns a
word into two fp16 values and one fp16x2 subtract of 1032 gives c - 8 exactly.

Two variants of each step, chosen by a constexpr:
- USE_ASM=True: inline PTX (lop3 + fp16x2 sub/fma): 9 instructions per 8 codes.
  Runs on NVIDIA GPUs only (the Triton interpreter cannot run PTX).
- USE_ASM=False: the same bit arithmetic in Triton operations on 16-bit halves;
  runs in the interpreter (TRITON_INTERPRET=1), which is how CI on the CPU checks
  the layout and the constants, and is a fallback should the PTX misbehave.
"""

from __future__ import annotations

import triton
import triton.language as tl

# fp16x2 constants: (1032.0, 1032.0), (1/16, 1/16), (-72.0, -72.0).
# tl.constexpr: a @jit function may only read globals declared as compile-time constants.
_DEQUANT_PTX = tl.constexpr("""
{
.reg .b32 t, s, c1032, c16th, cm72;
mov.b32 c1032, 0x64086408;
mov.b32 c16th, 0x2c002c00;
mov.b32 cm72, 0xd480d480;
lop3.b32 t, $4, 0x000f000f, 0x64006400, 0xea;
sub.f16x2 $0, t, c1032;
lop3.b32 t, $4, 0x00f000f0, 0x64006400, 0xea;
fma.rn.f16x2 $1, t, c16th, cm72;
shr.u32 s, $4, 8;
lop3.b32 t, s, 0x000f000f, 0x64006400, 0xea;
sub.f16x2 $2, t, c1032;
lop3.b32 t, s, 0x00f000f0, 0x64006400, 0xea;
fma.rn.f16x2 $3, t, c16th, cm72;
}
""")

# Dot product of 8 codes (4 fp16x2 pairs) with 8 activations (4 fp16x2 pairs):
# four fp16x2 multiply-adds, then the two lanes are added in fp32.
_DOT8_PTX = tl.constexpr("""
{
.reg .b32 acc;
.reg .b16 lo, hi;
.reg .f32 flo, fhi;
mul.rn.f16x2 acc, $1, $5;
fma.rn.f16x2 acc, $2, $6, acc;
fma.rn.f16x2 acc, $3, $7, acc;
fma.rn.f16x2 acc, $4, $8, acc;
mov.b32 {lo, hi}, acc;
cvt.f32.f16 flo, lo;
cvt.f32.f16 fhi, hi;
add.f32 $0, flo, fhi;
}
""")


@triton.jit
def _half(v, HIGH: tl.constexpr):
    """The low or high 16 bits of int32 v, reinterpreted as fp16."""
    if HIGH:
        v = v >> 16
    return (v & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def dequant_pairs(w, USE_ASM: tl.constexpr):
    """int32 words -> four int32 tensors, each two fp16 (c - 8) for codes (0,1), (2,3), (4,5), (6,7)."""
    if USE_ASM:
        p0, p1, p2, p3 = tl.inline_asm_elementwise(
            _DEQUANT_PTX,
            "=r,=r,=r,=r,r",
            [w],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True,
            pack=1,
        )
    else:
        s = w >> 8
        # The x16 pairs: (1024 + 16c) / 16 - 72 = c - 8; the others: (1024 + c) - 1032.
        p0 = _join16(((w & 0x000F000F) | 0x64006400), 1.0, -1032.0)
        p1 = _join16(((w & 0x00F000F0) | 0x64006400), 0.0625, -72.0)
        p2 = _join16(((s & 0x000F000F) | 0x64006400), 1.0, -1032.0)
        p3 = _join16(((s & 0x00F000F0) | 0x64006400), 0.0625, -72.0)
    return p0, p1, p2, p3


@triton.jit
def _join16(v, mul, add):
    """Apply fp16 (h * mul + add) to both halves of v and pack them back into int32."""
    lo = _half(v, False) * mul + add
    hi = _half(v, True) * mul + add
    lo_bits = lo.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi_bits = hi.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return lo_bits | (hi_bits << 16)


@triton.jit
def dot8(p0, p1, p2, p3, x0, x1, x2, x3, USE_ASM: tl.constexpr):
    """Sum over 8 codes of (c - 8) * x, from fp16x2 pairs packed in int32; fp32 result."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            _DOT8_PTX,
            "=f,r,r,r,r,r,r,r,r",
            [p0, p1, p2, p3, x0, x1, x2, x3],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    else:
        out = _pair_dot(p0, x0) + _pair_dot(p1, x1) + _pair_dot(p2, x2) + _pair_dot(p3, x3)
    return out


@triton.jit
def _pair_dot(p, x):
    return _half(p, False).to(tl.float32) * _half(x, False).to(tl.float32) + _half(p, True).to(
        tl.float32
    ) * _half(x, True).to(tl.float32)


@triton.jit
def unpack_tile(w, BLOCK_N: tl.constexpr, WORDS: tl.constexpr, USE_ASM: tl.constexpr):
    """int32 words [BLOCK_N, WORDS] -> fp16 (c - 8) [BLOCK_N, WORDS * 8] in input order."""
    p0, p1, p2, p3 = dequant_pairs(w, USE_ASM)
    # Build [N, W, pair-high, pair-low, half] so the flattened last dims run k = 0..7.
    lo = tl.join(
        tl.join(_half(p0, False), _half(p2, False)), tl.join(_half(p1, False), _half(p3, False))
    )
    hi = tl.join(
        tl.join(_half(p0, True), _half(p2, True)), tl.join(_half(p1, True), _half(p3, True))
    )
    return tl.reshape(tl.join(lo, hi), (BLOCK_N, WORDS * 8))


@triton.jit
def dequant_kernel(
    w_ptr,
    s_ptr,
    out_ptr,
    N,
    K,
    BLOCK_N: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    """Write the fp16 weight [N, K] = scales * (codes - 8), one group (128 inputs) per program column."""
    pid_n = tl.program_id(0)
    g = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, 16)
    rk = tl.arange(0, 128)
    mask = rn < N
    words = tl.load(
        w_ptr + rn[:, None] * (K // 8) + g * 16 + rw[None, :], mask=mask[:, None], other=0
    )
    codes = unpack_tile(words, BLOCK_N, 16, USE_ASM)
    s = tl.load(s_ptr + g * N + rn, mask=mask, other=0.0)
    w = codes * s[:, None]
    tl.store(out_ptr + rn[:, None] * K + g * 128 + rk[None, :], w, mask=mask[:, None])
