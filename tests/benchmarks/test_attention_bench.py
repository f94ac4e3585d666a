"""The attention benchmark: which implementations it times on this backend, and its report."""
from __future__ import annotations

import numpy as np

from searchrl.benchmarks import attention as bench


def test_cpu_compiles_the_portable_implementations_and_interprets_the_pallas_kernels():
    assert [c.impl for c in bench.attention_impls()] == ["blockwise"]
    assert [c.impl for c in bench.attention_impls(interpreted=True)] == ["blockwise", "pallas", "pallas_mha",
                                                                           "pallas_tpu"]


def test_run_times_each_implementation_against_the_reference_and_names_those_skipped():
    r = bench.run("tiny", batch=1, seq=16, rounds=1, calls=1, dtype="float32", interpreted=False)
    assert r["implementations"] == ["blockwise"] and not r["interpreted"] and not r["failed"]
    assert r["skipped"] == ["dot_product", "pallas", "pallas_mha", "pallas_tpu"]
    assert r["attention_blockwise_rounds"] == 1 and r["attention_blockwise_searchrl_s"] > 0


def test_packed_runs_time_rows_of_whole_sequences_then_padding():
    ids = bench.packed_ids(batch=3, seq=64)
    for row in ids:
        segments = row[row > 0]
        assert np.all(np.diff(segments) >= 0) and np.all(row[len(segments):] == 0)  # contiguous, then padding
        assert all(16 <= np.sum(row == s) <= 32 for s in np.unique(segments))
    r = bench.run("tiny", batch=2, seq=64, rounds=1, calls=1, dtype="float32", interpreted=False, packed=True)
    assert r["packed"] and r["implementations"] == ["blockwise"] and not r["failed"]
