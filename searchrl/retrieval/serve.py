"""Serve an index over HTTP with Search-R1's /retrieve API (see searchrl.retrieval.server).

  python -m searchrl.retrieval.serve --index DIR [--host 127.0.0.1] --port 8000 [--max-batch 256]
      [--max-hits 100000] [--max-connections 128] [--timeout-s 30]

The bounds on requests, connections and time are described in searchrl.retrieval.server.
"""
from __future__ import annotations

from typing import Sequence

from absl import flags

from searchrl import cli
from searchrl.retrieval import index_kind, load_retriever
from searchrl.retrieval.server import Limits, RetrievalServer


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    index = flags.DEFINE_string("index", None, "index dir (any kind)", required=True, flag_values=values)
    host = flags.DEFINE_string("host", "127.0.0.1", "address to bind (default: loopback only)",
                               flag_values=values)
    port = flags.DEFINE_integer("port", 8000, "port to listen on (0: any free port)", flag_values=values)
    max_batch = flags.DEFINE_integer("max-batch", 256, "queries gathered into one search call",
                                     flag_values=values)
    max_wait_ms = flags.DEFINE_float("max-wait-ms", 2.0, "how long a batch waits for more requests",
                                     flag_values=values)
    topk = flags.DEFINE_integer("topk", 3, 'hits when a request has no "topk"', flag_values=values)
    max_topk = flags.DEFINE_integer("max-topk", 1000, 'largest "topk" a request may ask for',
                                    flag_values=values)
    max_queries = flags.DEFINE_integer("max-queries", 1024, "queries one request may carry",
                                       flag_values=values)
    max_hits = flags.DEFINE_integer("max-hits", Limits.max_hits, 'largest queries x "topk" of a request',
                                    flag_values=values)
    max_connections = flags.DEFINE_integer("max-connections", Limits.max_connections,
                                           "connections served at once (more get 503)", flag_values=values)
    timeout_s = flags.DEFINE_float("timeout-s", Limits.timeout_s,
                                   "seconds to receive a whole request, and to send a response",
                                   flag_values=values)
    verbose = flags.DEFINE_boolean("verbose", False, "log every request", flag_values=values)
    cli.parse(values, argv, __doc__)

    limits = Limits(max_queries=max_queries.value, max_topk=max_topk.value, default_topk=topk.value,
                    max_hits=max_hits.value, max_connections=max_connections.value, timeout_s=timeout_s.value)
    server = RetrievalServer(load_retriever(index.value), host.value, port.value, max_batch=max_batch.value,
                             max_wait_ms=max_wait_ms.value, limits=limits, verbose=verbose.value)
    print(f"serving {index_kind(index.value)} index {index.value} on {server.url}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    cli.run(main)
