"""nib's own training pipeline for the shipped tiny code model (engine/assets/nib-tiny-code).

Runs on a host with torch, transformers, tokenizers, safetensors and numpy; it never
imports nib itself, so the GPU host needs nothing installed. `run_all.py` is the one
entry point; see training/README.md.
"""
