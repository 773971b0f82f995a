"""Weight-only INT4 (symmetric, group 128, fp16 scales): format, quantisers, kernels, checkpoints.

Model code never mentions it: `quantize_model` swaps nn.Linear modules for
Int4Linear after loading, and the GPTQ checkpoint loader builds Int4Linear
modules directly from a checkpoint's codes.
"""
