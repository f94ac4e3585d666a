"""Padded widths: a few static shapes that always hold the data."""
import pytest

from searchrl.shapes import padded_width


def test_padded_width_is_the_smallest_bucket_that_fits():
    # max_len 100 in 4 buckets: 25, 50, 75, 100.
    assert [padded_width(n, 100) for n in (0, 1, 25, 26, 74, 75, 99, 100)] == [25, 25, 25, 50, 75, 75, 100, 100]
    assert padded_width(7, 10, buckets=8) == 8  # quantum 2
    assert {padded_width(n, 584) for n in range(585)} == {146, 292, 438, 584}


def test_padded_width_rejects_lengths_that_do_not_fit():
    with pytest.raises(ValueError, match="outside 0..100"):
        padded_width(101, 100)
