"""Serve an index over HTTP with Search-R1's /retrieve API (see searchrl.serving.server).

  python -m searchrl.serving.serve --index DIR [--host 127.0.0.1] --port 8000 [--max_batch 256]
      [--max_batch_chars 65536] [--max_topk 3000] [--max_hits 100000] [--max_connections 4096]
      [--max_client_connections 64] [--idle_timeout_s 5] [--timeout_s 30] [--topk 3] ...
      [--device cpu|gpu:N] [--faiss_gpu replicate|shard [--faiss_gpus 0,1]]
  python -m searchrl.serving.serve --index DIR --print_fingerprint     (prints the index's fingerprint)

The bounds on requests, connections and time (`Limits` fields as flags, with their defaults) are described
in searchrl.serving.server. A dense index's query encoder runs on --device: the CPU by default, and then the
process uses no accelerator at all (JAX is restricted to its CPU platform), so a server next to a trainer
takes none of the trainer's memory; or a device reserved for retrieval (gpu:7). --faiss_gpu puts the FAISS
index on GPUs (--faiss_gpus, default all FAISS sees): a copy on each ("replicate") or a slice of the vectors
on each ("shard", for an index larger than one GPU); it needs a faiss-gpu build. GET /health names the index
served (path, kind, `searchrl.retrieval.index_fingerprint`) and the server's pid.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from absl import flags

from searchrl import cli
from searchrl.retrieval import index_fingerprint, index_kind, load_retriever
from searchrl.serving.server import Limits, RetrievalServer


def dense_options(kind: str, device: str, faiss_gpu: str, faiss_gpus: Sequence[int]) -> dict[str, Any]:
    """`load_retriever` options placing a dense index's encoder and FAISS index; none for other kinds, for
    which asking for FAISS on GPU is an error. A CPU encoder restricts JAX to its CPU platform, so that no
    accelerator is initialised (nor its memory preallocated)."""
    if kind != "dense":
        if faiss_gpu:
            raise ValueError(f"--faiss_gpu needs a dense (FAISS) index; this one is {kind}")
        return {}
    if device.partition(":")[0] == "cpu":
        import jax
        jax.config.update("jax_platforms", "cpu")
    return {"device": device, "faiss_gpu": faiss_gpu, "faiss_gpus": list(faiss_gpus)}


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
                       ("max_batch_chars", flags.DEFINE_integer,
                        "query characters gathered into one search call (its work)"),
                       ("max_wait_ms", flags.DEFINE_float, "how long a batch waits for more requests"),
                       ("default_topk", flags.DEFINE_integer, 'hits when a request has no "topk"'),
                       ("max_topk", flags.DEFINE_integer, 'largest "topk" a request may ask for'),
                       ("max_queries", flags.DEFINE_integer, "queries one request may carry"),
                       ("max_hits", flags.DEFINE_integer, 'largest queries x "topk" of a request'),
                       ("max_response_bytes", flags.DEFINE_integer, "largest response body"),
                       ("max_connections", flags.DEFINE_integer, "connections held at once (more get 503)"),
                       ("max_client_connections", flags.DEFINE_integer,
                        "connections held at once from one client address (more get 503)"),
                       ("idle_timeout_s", flags.DEFINE_float,
                        "seconds an idle connection (no request under way) is kept"),
                       ("timeout_s", flags.DEFINE_float,
                        "seconds to receive a whole request; a client not reading its response this long is "
                        "cut off"))}
    device = flags.DEFINE_string("device", "cpu", "a dense index's query encoder's device: cpu, or "
                                 "PLATFORM:INDEX (gpu:7) reserved for retrieval", flag_values=values)
    faiss_gpu = flags.DEFINE_enum("faiss_gpu", "", ["", "replicate", "shard"],
                                  "a dense index on GPUs: a copy on each, or a slice on each",
                                  flag_values=values)
    faiss_gpus = flags.DEFINE_list("faiss_gpus", [], "GPUs for --faiss_gpu (default: all FAISS sees)",
                                   flag_values=values)
    print_fingerprint = flags.DEFINE_boolean("print_fingerprint", False,
                                             "print the index's fingerprint and exit", flag_values=values)
    verbose = flags.DEFINE_boolean("verbose", False, "log every request", flag_values=values)
    cli.parse(values, argv, __doc__)

    gpus = cli.non_negative_ints(faiss_gpus.value, "faiss_gpus")
    try:
        fingerprint = index_fingerprint(index.value)
        if print_fingerprint.value:
            print(fingerprint)
            return
        kind = index_kind(index.value)
        retriever = load_retriever(index.value, **dense_options(kind, device.value, faiss_gpu.value, gpus))
    except (OSError, ValueError, RuntimeError) as e:  # no index there, no such device, no GPU for FAISS
        cli.fail(f"{index.value}: {e}")
    limits = Limits(**{name: flag.value for name, flag in limit_flags.items()})
    about = {"index": str(Path(index.value).resolve()), "kind": kind, "fingerprint": fingerprint,
             "pid": os.getpid()}
    try:
        server = RetrievalServer(retriever, host.value, port.value, limits, verbose.value, about)
    except OSError as e:  # the port is taken
        cli.fail(f"cannot listen on {host.value}:{port.value}: {e}")
    print(f"serving {kind} index {index.value} (fingerprint {fingerprint}) on {server.url}/retrieve",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    cli.run(main)
