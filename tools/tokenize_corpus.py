"""Tokenize a text corpus into Parquet shards that StreamingLoader packs, with Ray Data, so the
work runs on the cluster's CPUs.

    python tools/tokenize_corpus.py SOURCE OUT_DIR [--tokenizer bytes|HF_TOKENIZER_DIR]
        [--glob '*.txt'] [--rows-per-group 1024] [--address auto]

SOURCE is a folder of text files, one document a file (``--glob`` picks them, recursively), or a
URI Ray Data reads (``s3://bucket/texts``). Each document becomes one row: ``tokens`` (a list of
int32 token ids) and ``path``. ``--tokenizer bytes`` (the default) uses the UTF-8 bytes as ids
(vocabulary 256, like the language-model example); a folder that ``transformers.AutoTokenizer``
loads (``save_pretrained`` output; nothing is downloaded) uses that tokenizer. Row groups of
``--rows-per-group`` documents keep what a streaming reader fetches at once small.

Then, for example::

    train_dataloader = dict(type='StreamingLoader',
                            dataset=dict(type='ParquetShards', paths=OUT_DIR, columns=['tokens']),
                            pack=dict(column='tokens', seq_len=128, eos_token_id=0),
                            batch_size=32)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed_runner.data.streaming.corpus import tokenize  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source")
    p.add_argument("out_dir")
    p.add_argument("--tokenizer", default="bytes",
                   help="'bytes' (UTF-8 bytes as ids) or a saved Hugging Face tokenizer folder")
    p.add_argument("--glob", default="*.txt", help="files of a SOURCE folder ('*.txt')")
    p.add_argument("--rows-per-group", type=int, default=1024)
    p.add_argument("--actors", type=int, default=2, help="tokenizer actors at most (2)")
    p.add_argument("--address", default=None, help="a Ray cluster to run on (default: local)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import ray

    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    try:
        rows = tokenize(args.source, args.out_dir, args.tokenizer, args.glob,
                        args.rows_per_group, args.actors)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print(f"{rows} documents -> {args.out_dir}")


if __name__ == "__main__":
    sys.exit(main())
