"""NGramPool: LADE's n-gram pool and Self-Draft's context cache (LRU per first token)."""

import pytest

from specbench.errors import ConfigError
from specbench.structures.pool import NGramPool


def test_query_is_most_recent_first_and_limited():
    pool = NGramPool(capacity=5)
    for value in [(1, 2), (3, 4), (5, 6)]:
        pool.insert(7, value)
    assert pool.query(7, 10) == [(5, 6), (3, 4), (1, 2)]
    assert pool.query(7, 2) == [(5, 6), (3, 4)]
    assert pool.query(8, 3) == []
    assert len(pool) == 1 and pool.num_tuples == 3


def test_reinsert_moves_to_most_recent_without_duplicating():
    pool = NGramPool(capacity=3)
    for value in [(1,), (2,), (3,)]:
        pool.insert(0, value)
    pool.insert(0, (1,))
    assert pool.query(0, 3) == [(1,), (3,), (2,)]
    assert pool.num_tuples == 3


def test_full_key_evicts_least_recently_used():
    pool = NGramPool(capacity=2)
    pool.insert(0, (1,))
    pool.insert(0, (2,))
    pool.insert(0, (1,))  # (2,) is now the oldest
    pool.insert(0, (3,))
    assert pool.query(0, 5) == [(3,), (1,)]
    assert pool.num_tuples == 2
    pool.insert(9, (4,))  # keys are independent
    assert pool.query(9, 5) == [(4,)] and pool.num_tuples == 3 and len(pool) == 2


def test_keep_recent_reduces_every_key():
    pool = NGramPool(capacity=10)
    for i in range(6):
        pool.insert(1, (i,))
    pool.insert(2, (9,))
    pool.keep_recent(2)
    assert pool.query(1, 10) == [(5,), (4,)]
    assert pool.query(2, 10) == [(9,)]
    assert pool.num_tuples == 3
    pool.insert(1, (4,))  # LRU order survives the reduction
    assert pool.query(1, 10) == [(4,), (5,)]
    pool.keep_recent(0)
    assert len(pool) == 0 and pool.num_tuples == 0


def test_insert_sequence_keys_every_complete_ngram():
    pool = NGramPool(capacity=4)
    pool.insert_sequence([1, 2, 3, 1, 2, 4], value_len=2)
    assert pool.query(1, 4) == [(2, 4), (2, 3)]
    assert pool.query(2, 4) == [(3, 1)]
    assert pool.query(3, 4) == [(1, 2)]
    assert pool.query(4, 4) == []  # no complete continuation
    pool.clear()
    pool.insert_sequence([5, 6, 7, 8], value_len=2, start=1)
    assert pool.query(5, 4) == [] and pool.query(6, 4) == [(7, 8)]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3"])
def test_bad_capacity_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="guess_set_size"):
        NGramPool(bad, "guess_set_size")
