"""Command lines of searchrl's tools: absl flags, each tool's on a `flags.FlagValues` of its own.

absl's global `flags.FLAGS` holds the flags of the entry points `searchrl.main`, `searchrl.eval` and
`searchrl.demo`, which start with `run_app`. The tools share flag names (--index, --out, --batch_size, ...) and are imported together (one
tool uses another's functions; tests call several tools' `main` in one process), so each `main(argv)` defines
its flags on a new FlagValues, which also gives every call the defaults of the flags it does not set:

    def main(argv: Sequence[str] | None = None) -> None:
        values = flags.FlagValues()
        out = flags.DEFINE_string("out", None, "output directory", required=True, flag_values=values)
        cli.parse(values, argv, __doc__)
        ...  # out.value

    if __name__ == "__main__":
        cli.run(main)

Every tool's --help exits 0, and library logs (absl, orbax, JAX) stay at WARNING unless --verbosity (-v) asks
for more: 0 for INFO, 1 for DEBUG (absl's levels).
"""
from __future__ import annotations

import functools
import os
import re
import shlex
import sys
from collections.abc import Callable, Collection, Sequence
from typing import NoReturn

from absl import app, flags, logging

from searchrl.configlib import ConfigError

QUIET = logging.WARNING  # absl verbosity of the tools unless --verbosity says otherwise (INFO is 0, DEBUG 1)


class _HelpFlag(flags.BooleanFlag):
    """--help / -h: prints the tool's docstring and its flags, then exits."""

    def __init__(self, values: flags.FlagValues, doc: str):
        super().__init__("help", False, "show this help and exit", short_name="h")
        self._values, self._doc = values, doc

    def parse(self, argument: str | bool) -> None:
        super().parse(argument)
        if self.value:
            print(f"{self._doc}\nflags:\n{self._values.get_help(include_special_flags=False)}")
            sys.exit(0)


def underscored(word: str, names: Collection[str]) -> str:
    """`word` with a flag name written with dashes (--batch-size=8, --no-normalize) spelled as defined, with
    underscores, when `names` (the tool's flags) has it: the tools' flags once used dashes, and those
    spellings keep working. Any other word is returned as it is."""
    if not word.startswith("--"):
        return word
    name, sep, value = word[2:].partition("=")
    spelled = name.replace("-", "_")
    return f"--{spelled}{sep}{value}" if spelled in names and spelled != name else word


def _parse(values: flags.FlagValues, argv: Sequence[str] | None, doc: str) -> list[str]:
    """The positional words of `argv` (default: the command line after the program name), its flags parsed
    into `values`; a flag error is printed to stderr and exits with status 1. An explicit --verbosity sets
    absl's logging level."""
    tool_module = next(iter(values.flags_by_module_dict()))  # lists --help and --verbosity with the tool's flags
    flags.DEFINE_flag(_HelpFlag(values, doc), values, module_name=tool_module)
    verbosity = flags.DEFINE_integer("verbosity", QUIET, "logging level: -1 warnings, 0 info, 1 debug",
                                     short_name="v", flag_values=values, module_name=tool_module)
    try:
        given = sys.argv[1:] if argv is None else argv
        words = _parsing_overrides(values, [sys.argv[0], *(underscored(word, values) for word in given)])[1:]
    except flags.Error as e:
        _exit_with_error(str(e))
    if values["verbosity"].present:
        logging.set_verbosity(verbosity.value)
    return words


_MISSING_KEY = re.compile(r"'\\?'?(\w+)\\?'")  # ml_collections' error for a missing key: 'lamda' ...
_SUGGESTION = re.compile(r'Did you mean "(\w+)"')


def override_error(error: Exception, words: Sequence[str]) -> str | None:
    """The one line for an override of a field the config lacks (ml_collections' AttributeError or KeyError,
    raised while parsing `words`): "no field rl.lamda (--config.rl.lamda=1); did you mean rl.lam?". None when
    `error` names no field of a `--config.x.y` override in `words`."""
    text = str(error)
    missing = _MISSING_KEY.search(text)
    if missing is None:
        return None
    key, suggestion = missing.group(1), _SUGGESTION.search(text)
    for word in words:
        name, _, path = word.lstrip("-").partition("=")[0].partition(".")
        parts = path.split(".")
        if word.startswith("--") and key in parts:
            prefix = parts[: parts.index(key)]
            line = f"no field {'.'.join([*prefix, key])} in --{name} ({word})"
            return line + (f"; did you mean {'.'.join([*prefix, suggestion.group(1)])}?" if suggestion else "")
    return None


def _parsing_overrides(parse: Callable[[list[str]], list[str]], argv: list[str]) -> list[str]:
    """`parse(argv)`, ending the tool with one line (`fail`) on an override of a field its config lacks."""
    try:
        return parse(argv)
    except (AttributeError, KeyError) as e:
        if (line := override_error(e, argv)) is None:
            raise
        fail(line)


def _exit_with_error(message: str) -> NoReturn:
    sys.stderr.write(f"FATAL Flags parsing error: {message}\nPass --help to see help on flags.\n")
    sys.exit(1)


def fail(message: str) -> NoReturn:
    """Ends a tool on an error its user can fix (a path, an existing output): the message on stderr, exit
    status 1, no traceback."""
    sys.stderr.write(f"error: {message}\n")
    sys.exit(1)


class MissingInput(FileNotFoundError):
    """A model, tokenizer, dataset or index a run reads is not on disk. The message is one line: what, its
    path and the command that makes it; `run` and `run_app` end a tool on it with that line (`fail`)."""

    def __init__(self, what: str, path: str | os.PathLike, remedy: str):
        super().__init__(f"{what} not found: {path} ({remedy})")
        self.path, self.remedy = str(path), remedy


class Damaged(RuntimeError):
    """Files searchrl made earlier and reads back (a cache) cannot be read. The message is one line: what,
    the path to delete and the error; `run` and `run_app` end a tool on it with that line."""

    def __init__(self, what: str, path: str | os.PathLike, cause: BaseException):
        error = " ".join(str(cause).split()) or "no message"
        super().__init__(f"{what} {path} is damaged ({type(cause).__name__}: {error}): delete it and run "
                         "again, it is made anew")


DOWNLOAD = ("python", "-m", "searchrl.data.download")


# The hub organisations of the models the configs name, by how a model's name starts: the download tool
# names a model's folder after the last part of its hub name, so a folder's name gives the organisation back.
HUB_ORGANISATIONS = {"Qwen": "Qwen", "Llama-": "meta-llama", "Meta-Llama-": "meta-llama", "Mistral-": "mistralai",
                     "e5-": "intfloat", "multilingual-e5-": "intfloat", "bge-": "BAAI", "contriever": "facebook",
                     "ms-marco-": "cross-encoder", "all-MiniLM-": "sentence-transformers"}


def hub_name(path: str | os.PathLike) -> str | None:
    """The hub name ("Qwen/Qwen2.5-3B") of the model whose folder is `path`, None when its name starts like
    no model of HUB_ORGANISATIONS."""
    name = os.path.basename(os.path.normpath(path))
    return next((f"{org}/{name}" for start, org in HUB_ORGANISATIONS.items() if name.startswith(start)), None)


def fetch_model(path: str | os.PathLike) -> str:
    """How to put a hub model at `path`: the download tool's `model` command writes OUT/<last part of the
    hub name>. A model of HUB_ORGANISATIONS is named by its hub name; any other by ORG/<folder name>."""
    path = os.path.normpath(path)
    known = hub_name(path)
    command = [*DOWNLOAD, "model", "--names", known or f"ORG/{os.path.basename(path)}", "--out",
               os.path.dirname(path)]
    return f"fetch it with: {shlex.join(command)}" + ("" if known else ", ORG its hub organisation (docs/data.md)")


def fetch_qa(directory: str, name: str, split: str) -> str:
    """How to put FlashRAG's `name` `split` under `directory` (config.data.dir, format "qa")."""
    command = [*DOWNLOAD, "qa", "--names", name, "--splits", split, "--out", directory]
    return f"fetch it with: {shlex.join(command)}"


def make_index(path: str | os.PathLike) -> str:
    """How to make a searchrl index at `path`: build it from a corpus, or import Search-R1's e5 index."""
    build = ["python", "-m", "searchrl.retrieval.index", "--kind", "bm25", "--corpus", "CORPUS.jsonl",
             "--out", str(path)]
    wiki18 = [*DOWNLOAD, "wiki18", "--out", "WIKI18_DIR", "--index_dir", str(path), "--encoder", "E5_DIR"]
    return f"build it with: {shlex.join(build)}; or Search-R1's e5 index: {shlex.join(wiki18)}"


def parse(values: flags.FlagValues, argv: Sequence[str] | None, doc: str) -> None:
    """Parses `argv` (default: the command line after the program name) into the tool's flags `values`.

    --help / -h prints `doc` and the flags, then exits with status 0. An unknown or malformed flag, a
    missing required one, a failed validator or a positional argument prints the error to stderr and exits
    with status 1.
    """
    words = _parse(values, argv, doc)
    if words:
        _exit_with_error(f"unexpected arguments {words}")


def parse_command(values: flags.FlagValues, argv: Sequence[str] | None, doc: str,
                  commands: Collection[str]) -> str:
    """`parse` for a tool with commands: `argv` holds one positional word out of `commands`, which is
    returned."""
    words = _parse(values, argv, doc)
    if len(words) != 1 or words[0] not in commands:
        _exit_with_error(f"expected one command out of {sorted(commands)}, got {words}")
    return words[0]


def parse_argument(values: flags.FlagValues, argv: Sequence[str] | None, doc: str, name: str) -> str:
    """`parse` for a tool with one positional argument (`name` in the error); returns it."""
    words = _parse(values, argv, doc)
    if len(words) != 1:
        _exit_with_error(f"expected one {name}, got {words}")
    return words[0]


def non_negative_ints(values: Sequence[str], flag: str) -> list[int]:
    """Integers >= 0 from a list flag's values; anything else is a usage error naming the flag and value."""
    for value in values:
        if not value.strip().isdigit():
            raise app.UsageError(f"--{flag}: {value!r} is not a non-negative integer.")
    return [int(value) for value in values]


def _program_name_only(argv: list[str]) -> list[str]:
    """app.run's flag parser: absl's global flags keep their defaults and every argument goes to the tool."""
    flags.FLAGS(argv[:1])
    return argv


def run(main: Callable[[list[str]], object]) -> None:
    """Runs a tool's `main` under `absl.app` (logging, `app.UsageError` handling) on the command line after
    the program name, library logs at WARNING unless its --verbosity says otherwise; a `MissingInput`, a
    `Damaged` or a `ConfigError` ends it with its one line; `main`'s return value is not an exit status."""
    def main_of_command_line(argv: list[str]) -> None:
        logging.set_verbosity(QUIET)
        main(argv[1:])

    app.run(_failing_on_bad_input(main_of_command_line), flags_parser=_program_name_only)


def _failing_on_bad_input(main: Callable[[list[str]], object]) -> Callable[[list[str]], object]:
    """`main` ending the tool with `fail` on a `MissingInput`, a `Damaged` or a `ConfigError`: its one line,
    no traceback."""
    @functools.wraps(main)
    def failing(argv: list[str]) -> object:
        try:
            return main(argv)
        except (MissingInput, Damaged, ConfigError) as e:
            fail(str(e))
    return failing


def _exits_zero(parse: Callable[[object], None]) -> Callable[[object], None]:
    """An absl help flag's `parse` that exits with status 0 where absl's exits with 1 (after printing the
    usage): asking for help is no failure."""
    @functools.wraps(parse)
    def parse_exiting_zero(argument: object) -> None:
        try:
            parse(argument)
        except SystemExit:
            sys.exit(0)
    return parse_exiting_zero


def _parse_quietly(argv: list[str]) -> list[str]:
    """app.run's flag parser for the global flags: absl's own, except that an unset --verbosity means
    WARNING (absl would raise it to INFO)."""
    words = _parsing_overrides(app.parse_flags_with_usage, argv)
    if flags.FLAGS["verbosity"].using_default_value:
        flags.FLAGS.verbosity = QUIET
    return words


def run_app(main: Callable[[list[str]], object]) -> None:
    """`absl.app.run(main)` for an entry point on absl's global flags (`searchrl.main`, `.eval`, `.demo`):
    --help, --helpshort and --helpfull exit 0, library logs stay at WARNING unless --verbosity (-v) raises
    them, and a `MissingInput`, a `Damaged` or a `ConfigError` ends it with its one line."""
    app.define_help_flags()
    for name in ("help", "helpshort", "helpfull"):
        flag = flags.FLAGS[name]
        flag.parse = _exits_zero(flag.parse)
    app.run(_failing_on_bad_input(main), flags_parser=_parse_quietly)
