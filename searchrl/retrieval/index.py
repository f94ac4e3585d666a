"""Build a retrieval index from a JSONL corpus (FlashRAG {"id", "contents"} or BEIR {"_id", "title", "text"}).

  python -m searchrl.retrieval.index --kind bm25   --corpus C.jsonl --out DIR [--k1 0.9 --b 0.4]
  python -m searchrl.retrieval.index --kind lucene --corpus C.jsonl --out DIR [--threads 4]
  python -m searchrl.retrieval.index --kind dense  --corpus C.jsonl --out DIR --encoder ENC [--factory Flat]
      [--pooling mean|cls] [--no_normalize] [--query_prefix "query: " --passage_prefix "passage: "] (e5)

--kind is any name in `searchrl.retrieval.INDEX_KINDS`; the other flags are those its build takes (each
flag's help names the kinds that read it). Every index dir gets a searchrl_index.json manifest;
`searchrl.retrieval.load_retriever(DIR)` opens any kind. The index is built in a temporary dir next to --out
and moved there once complete: a failed build leaves nothing behind and an index already at --out as it was.
"""
from __future__ import annotations

import json
import time
from typing import Any, Sequence

from absl import flags

from searchrl import cli
from searchrl.retrieval import INDEX_KINDS, read_manifest
from searchrl.retrieval.kinds import BuildFlag


def define_build_flags(values: flags.FlagValues) -> dict[str, Any]:
    """Defines every registered kind's build flags once each, its help naming the kinds that read it, with
    their checks and "--kind K needs --F" for the flags a kind requires; returns the flags by name."""
    declared: dict[str, tuple[BuildFlag, list[str]]] = {}
    for kind in INDEX_KINDS:
        for flag in INDEX_KINDS.get(kind).flags:
            first, kinds = declared.setdefault(flag.name, (flag, []))
            if first != flag:
                raise ValueError(f"index kinds {kinds[0]!r} and {kind!r} declare flag --{flag.name} "
                                 "differently")
            kinds.append(kind)
    holders = {}
    for name, (flag, kinds) in declared.items():
        holders[name] = flag.define(name, flag.default, help=f"{flag.help} ({', '.join(kinds)})",
                                    flag_values=values, **flag.options)
        if flag.check is not None:
            flags.register_validator(name, flag.check[0], flag.check[1], flag_values=values)
        for kind in kinds if flag.required else ():
            flags.register_multi_flags_validator(
                ["kind", name], lambda f, kind=kind, name=name: f["kind"] != kind or bool(f[name]),
                f"--kind {kind} needs --{name}", flag_values=values)
    return holders


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    kind = flags.DEFINE_enum("kind", None, INDEX_KINDS.names(), "index kind", required=True,
                             flag_values=values)
    corpus = flags.DEFINE_string("corpus", None, "corpus JSONL", required=True, flag_values=values)
    out = flags.DEFINE_string("out", None, "index dir to write", required=True, flag_values=values)
    skip_malformed = flags.DEFINE_boolean("skip_malformed", False, "skip and count malformed corpus lines",
                                          flag_values=values)
    build_flags = define_build_flags(values)
    cli.parse(values, argv, __doc__)

    start = time.perf_counter()
    entry = INDEX_KINDS.get(kind.value)
    entry.build(corpus.value, out.value, skip_malformed=skip_malformed.value,
                **{flag.name: build_flags[flag.name].value for flag in entry.flags})
    print(json.dumps({"kind": kind.value, "out": out.value, "passages": read_manifest(out.value).get("count"),
                      "seconds": round(time.perf_counter() - start, 2)}))


if __name__ == "__main__":
    cli.run(main)
