"""searchrl's command line: `searchrl COMMAND [flags]`, or `python -m searchrl COMMAND [flags]`.

Each command runs a tool's own entry point with the flags after it, as `python -m MODULE [flags]` would:
`searchrl COMMAND --help` shows that tool's flags.
"""
from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from typing import NamedTuple


class Command(NamedTuple):
    """A command: the module it runs as `__main__`, the words it appends to the flags, and what it does."""

    module: str
    words: tuple[str, ...]
    about: str


COMMANDS: dict[str, Command] = {
    "train": Command("searchrl.main", ("train",), "RL from a config (PPO, GRPO, ...), resuming its workdir"),
    "sft": Command("searchrl.main", ("sft",), "a supervised cold start on the env's reference responses"),
    "info": Command("searchrl.main", ("info",), "a config resolved, its mesh and its model's size"),
    "world": Command("searchrl.main", ("world",), "build a miniature's world (datasets, index, tokenizer)"),
    "check": Command("searchrl.check", (), "everything a config needs on this machine, and how to get it"),
    "eval": Command("searchrl.eval", (), "greedy evaluation of a checkpoint: the papers' tables"),
    "demo": Command("searchrl.demo", (), "a paper's CPU miniature, end to end"),
    "reproduce": Command("searchrl.demo.reproduce", (), "the three miniatures over seeds, claims checked"),
    "serve": Command("searchrl.serving.serve", (), "the Search-R1 /retrieve server over an index"),
    "index": Command("searchrl.retrieval.index", (), "build a BM25 or dense index from a corpus"),
    "download": Command("searchrl.data.download", (), "fetch datasets, corpora, indexes and models"),
    "export": Command("searchrl.checkpoint", (), "a trainer checkpoint as a Hugging Face model"),
}


def usage() -> str:
    """The commands, one a line."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.about} ({command.module})" for name, command in COMMANDS.items()]
    return "\n".join([__doc__.strip(), "", "commands:", *lines])


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the command named first in `argv` (default: the command line) on the words after it."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        sys.exit(0 if args else 2)
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        sys.stderr.write(f"searchrl: unknown command {name!r}; commands: {', '.join(COMMANDS)} "
                         "(searchrl --help)\n")
        sys.exit(2)
    command = COMMANDS[name]
    sys.argv = [f"searchrl {name}", *rest, *command.words]
    runpy.run_module(command.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
