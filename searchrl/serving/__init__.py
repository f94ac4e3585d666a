"""searchrl.serving: Search-R1's `/retrieve` service over any searchrl retriever (`server`), and its command
line (`python -m searchrl.serving.serve`). Its client is a retriever like the others:
`searchrl.retrieval.remote`."""
