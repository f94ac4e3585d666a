"""Tokenizers: load a Hugging Face tokenizer directory offline, or train a small byte-level BPE one.

Training is for self-contained worlds (tests, the demo): the protocol tags become single special tokens so that
stop sequences and masks are exact, and the result is saved as an ordinary Hugging Face tokenizer directory.
"""
from __future__ import annotations

import os
from typing import Iterable, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
import transformers

from searchrl import cli
from searchrl.text import tags

EOS = "<|endoftext|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "vocab.txt")
PROTOCOL_TAGS = tuple(t for tag in (tags.THINK, tags.SEARCH, tags.INFORMATION, tags.ANSWER)
                      for t in (tags.open_tag(tag), tags.close_tag(tag)))


def load_tokenizer(path: str) -> transformers.PreTrainedTokenizerBase:
    """A tokenizer from a local directory (never a hub id: searchrl runs offline)."""
    if not os.path.isdir(path):
        raise cli.MissingInput("tokenizer", path, cli.fetch_model(path))
    if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
        # transformers would build an empty tokenizer that encodes every text to []
        raise cli.MissingInput(f"tokenizer files ({', '.join(TOKENIZER_FILES)})", path, cli.fetch_model(path))
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    out_dir: str | None = None,
    special_tokens: Sequence[str] = PROTOCOL_TAGS,
    split_pattern: str | None = None,
) -> transformers.PreTrainedTokenizerBase:
    """Trains a byte-level BPE tokenizer (EOS first, then `special_tokens`), saving it to `out_dir` if given.

    split_pattern: a regex whose every match becomes a piece of its own before byte-level BPE, so that no
    token spans a match's boundary (a world's names cut into syllables, say).
    """
    bpe = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.pre_tokenizer = byte_level if split_pattern is None else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"), byte_level])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, *special_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, pad_token=EOS)
    if out_dir is not None:
        tokenizer.save_pretrained(out_dir)
    return tokenizer
