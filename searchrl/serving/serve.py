"""Serve an index over HTTP with Search-R1's /retrieve API (see searchrl.serving.server).

  python -m searchrl.serving.serve --index DIR [--host 127.0.0.1] --port 8000 [--max_batch 256]
      [--max_hits 100000] [--max_connections 4096] [--max_client_connections 64] [--idle_timeout_s 5]
      [--timeout_s 30] [--topk 3] ...

The bounds on requests, connections and time (`Limits` fields as flags, with their defaults) are described
in searchrl.serving.server.
"""
from __future__ import annotations

from typing import Sequence

from absl import flags

from searchrl import cli
from searchrl.retrieval import index_kind, load_retriever
from searchrl.serving.server import Limits, RetrievalServer


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    index = flags.DEFINE_string("index", None, "index dir (any kind)", required=True, flag_values=values)
    host = flags.DEFINE_string("host", "127.0.0.1", "address to bind (default: loopback only)",
                               flag_values=values)
    port = flags.DEFINE_integer("port", 8000, "port to listen on (0: any free port)", flag_values=values)
    names = {"default_topk": "topk"}  # Search-R1's retrieval server's flag; the others are the fields' names
    limit_flags = {name: define(names.get(name, name), getattr(Limits, name), help_text,
                                flag_values=values)
                   for name, define, help_text in (
                       ("max_batch", flags.DEFINE_integer, "queries gathered into one search call"),
                       ("max_wait_ms", flags.DEFINE_float, "how long a batch waits for more requests"),
                       ("default_topk", flags.DEFINE_integer, 'hits when a request has no "topk"'),
                       ("max_topk", flags.DEFINE_integer, 'largest "topk" a request may ask for'),
                       ("max_queries", flags.DEFINE_integer, "queries one request may carry"),
                       ("max_hits", flags.DEFINE_integer, 'largest queries x "topk" of a request'),
                       ("max_connections", flags.DEFINE_integer, "connections held at once (more get 503)"),
                       ("max_client_connections", flags.DEFINE_integer,
                        "connections held at once from one client address (more get 503)"),
                       ("idle_timeout_s", flags.DEFINE_float,
                        "seconds an idle connection (no request under way) is kept"),
                       ("timeout_s", flags.DEFINE_float,
                        "seconds to receive a whole request; a client not reading its response this long is "
                        "cut off"))}
    verbose = flags.DEFINE_boolean("verbose", False, "log every request", flag_values=values)
    cli.parse(values, argv, __doc__)

    limits = Limits(**{name: flag.value for name, flag in limit_flags.items()})
    server = RetrievalServer(load_retriever(index.value), host.value, port.value, limits, verbose.value)
    print(f"serving {index_kind(index.value)} index {index.value} on {server.url}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    cli.run(main)
