"""The block and partition cache: byte bound, LRU eviction, and its approximate recency."""

from __future__ import annotations

from slatepy.table.cache import RECENCY_SHIFT, LruCache


def filled(count: int, capacity: int | None = None) -> LruCache[int]:
    cache: LruCache[int] = LruCache(count if capacity is None else capacity)
    for i in range(count):
        cache.put(i, i, 1)
    return cache


def test_the_summed_size_stays_within_capacity_and_the_oldest_goes_first() -> None:
    cache = filled(64)
    cache.put(64, 64, 1)
    assert cache.size == 64 and len(cache) == 64
    assert cache.get(0) is None and cache.get(1) == 1
    assert (cache.hits, cache.misses) == (1, 1)


def test_an_entry_larger_than_the_capacity_stays_until_the_next_put() -> None:
    cache = filled(4)
    cache.put("big", 99, 10)
    assert len(cache) == 1 and cache.get("big") == 99
    cache.put("next", 1, 1)
    assert cache.get("big") is None and cache.get("next") == 1


def test_an_entry_used_after_a_window_of_insertions_moves_to_the_young_end() -> None:
    cache = filled(64)
    window = 64 >> RECENCY_SHIFT
    for i in range(64, 64 + window + 1):  # evicts 0..window; more insertions than the window
        cache.put(i, i, 1)
    assert cache.get(window + 1) == window + 1  # now the oldest entry: moved on this hit
    cache.put("new", 0, 1)
    assert cache.get(window + 1) is not None, "a used entry was evicted as the oldest"
    assert cache.get(window + 2) is None, "the next oldest should have gone instead"


def test_an_entry_used_again_within_the_window_keeps_its_place() -> None:
    # What makes hits cheap: no reordering for an entry moved within the last window of
    # insertions, so a warm cache that takes no insertions reorders an entry at most once.
    cache = filled(64)
    order = list(cache._entries)
    for key in range(64 - (64 >> RECENCY_SHIFT), 64):  # inserted within the window
        assert cache.get(key) == key
    assert list(cache._entries) == order
    assert cache.get(0) == 0  # inserted 63 insertions ago: moved
    assert list(cache._entries) == [*order[1:], 0]
    assert cache.get(0) == 0 and list(cache._entries) == [*order[1:], 0]


def test_add_never_replaces_an_entry_and_clear_empties() -> None:
    cache = filled(8)
    assert not cache.add(3, 33, 1) and cache.get(3) == 3
    assert cache.add("x", 1, 1) and cache.get("x") == 1
    cache.clear()
    assert len(cache) == 0 and cache.size == 0 and cache.get("x") is None
