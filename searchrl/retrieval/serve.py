"""Serve an index over HTTP with Search-R1's /retrieve API (see searchrl.retrieval.server).

  python -m searchrl.retrieval.serve --index DIR [--host 127.0.0.1] --port 8000 [--max-batch 256]
"""
from __future__ import annotations

import argparse
from typing import Sequence

from searchrl.retrieval import index_kind, load_retriever
from searchrl.retrieval.server import Limits, RetrievalServer


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, help="index dir (any kind)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch", type=int, default=256, help="queries gathered into one search call")
    parser.add_argument("--max-wait-ms", type=float, default=2.0,
                        help="how long a batch waits for more requests")
    parser.add_argument("--topk", type=int, default=3, help='hits when a request has no "topk"')
    parser.add_argument("--max-topk", type=int, default=1000)
    parser.add_argument("--max-queries", type=int, default=1024, help="queries one request may carry")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)

    limits = Limits(max_queries=args.max_queries, max_topk=args.max_topk, default_topk=args.topk)
    server = RetrievalServer(load_retriever(args.index), args.host, args.port, max_batch=args.max_batch,
                             max_wait_ms=args.max_wait_ms, limits=limits, verbose=args.verbose)
    print(f"serving {index_kind(args.index)} index {args.index} on {server.url}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()
