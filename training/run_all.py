"""Make nib's shipped model in one command: corpus, tokenizer, training, evaluation, card, package.

    python3 training/run_all.py --out "$OUT" --budget-s 560            # the H200 run
    python3 training/run_all.py --out /tmp/o --preset tiny --budget-s 25 --device cpu   # smoke

Everything finishes inside --budget-s (wall clock from process start): training
gets whatever the data preparation leaves, minus the preset's reserve for
saving and evaluating. $OUT receives the safetensors shards, one tar.gz with
everything else, and train_log.txt; install them with training/unpack.py.
Needs torch, transformers, tokenizers, safetensors and numpy; not nib.
"""

from __future__ import annotations

import time

STARTED = time.monotonic()

import argparse  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.pipeline import RunLog, run  # noqa: E402
from training.presets import PRESETS  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="where the returned files go ($OUT)")
    p.add_argument("--budget-s", type=float, default=560.0, help="wall clock for everything")
    p.add_argument("--preset", choices=sorted(PRESETS), default="h200")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--seed", type=int, default=None, help="override the preset's seed")
    p.add_argument("--steps", type=int, default=None, help="fixed step count (reproduces a run)")
    p.add_argument("--warmup-steps", type=int, default=None, help="fixed warmup (with --steps)")
    p.add_argument("--train-seconds", type=float, default=None, help="override the training time")
    p.add_argument("--max-corpus-mb", type=float, default=None, help="cap the corpus size")
    p.add_argument("--batch-size", type=int, default=None, help="override sequences per step")
    p.add_argument("--lr", type=float, default=None, help="override the peak learning rate")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (GPU)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--work", type=Path, default=None, help="build folder (default: a temp dir)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="nib-train-"))
    work.mkdir(parents=True, exist_ok=True)
    log = RunLog(work / "train_log.txt", STARTED)
    command = shlex.join([Path(sys.executable).as_posix(), *sys.argv])
    log(f"command: {command}")
    preset = PRESETS[args.preset].with_overrides(
        seed=args.seed,
        max_corpus_bytes=None if args.max_corpus_mb is None else int(args.max_corpus_mb * 1e6),
        compile=True if args.compile else None,
        batch_size=args.batch_size,
        lr=args.lr,
    )
    try:
        return run(preset, args, work, log, command, STARTED)
    except Exception:
        log("FAILED:\n" + traceback.format_exc())
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "train_log.txt").write_text((work / "train_log.txt").read_text())
        return 1


if __name__ == "__main__":
    sys.exit(main())
