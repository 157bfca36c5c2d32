"""Write a small Llama as ``save_pretrained`` writes one: the stand-in for a downloaded model.

    python tools/make_tiny_llama.py [OUT_DIR] [--hidden 128] [--layers 4] [--heads 4]
                                    [--max-shard-size 500KB] [--seed 0]

Why: fine-tuning starts from a directory of pretrained weights, and nothing here downloads one.
This builds a ``LlamaForCausalLM`` from its config (random weights, seeded), then writes it with
``save_pretrained`` — ``config.json``, ``generation_config.json``, the weights in safetensors
shards of at most ``--max-shard-size`` with their ``model.safetensors.index.json`` (so loading
it takes the path a real 8B model does) — and a byte tokenizer (``tokenizer.json``: id ``b`` is
byte ``b``, the vocabulary of the byte corpus, ``tools/make_byte_corpus.py``), so
``AutoModelForCausalLM.from_pretrained(OUT_DIR)`` and ``AutoTokenizer.from_pretrained(OUT_DIR)``
both work offline. Default OUT_DIR: ``data/tiny_llama`` (git-ignored).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def byte_characters() -> dict[int, str]:
    """The character ByteLevel pre-tokenization writes for each byte: printable Latin-1 bytes
    stand for themselves, the others (controls, space) for 256, 257, ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0x100)]
    others = (b for b in range(256) if b not in printable)
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + n) for n, b in enumerate(others)})
    return table


def byte_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    """A tokenizer whose ids are the bytes themselves (0..255), as the byte corpus stores them:
    GPT-2's byte-to-character table names each byte, with no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in byte_characters().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def make(out_dir: Path, hidden: int, layers: int, heads: int, shard: str, seed: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=hidden, intermediate_size=hidden * 2 + hidden // 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
        max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, max_shard_size=shard)
    byte_tokenizer().save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", nargs="?", default="data/tiny_llama")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--max-shard-size", default="500KB")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = make(Path(args.out_dir), args.hidden, args.layers, args.heads, args.max_shard_size,
               args.seed)
    files = sorted(p.name for p in out.iterdir())
    print(f"wrote {out}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
