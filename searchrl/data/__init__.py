"""Datasets: FlashRAG / Search-R1 QA records, BEIR queries with qrels, and the retrieval task families, read
by a run from their TFDS copies (`searchrl.data.datasets.load_examples`)."""
from searchrl.data.beir import BeirDoc, BeirQuery, read_beir_queries, read_beir_split
from searchrl.data.flashrag import QARecord, read_flashrag_jsonl, read_search_r1_parquet
from searchrl.data.jsonl import DataFormatError

__all__ = [
    "BeirDoc", "BeirQuery", "DataFormatError", "QARecord", "read_beir_queries", "read_beir_split",
    "read_flashrag_jsonl", "read_search_r1_parquet",
]
