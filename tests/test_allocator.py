"""The caching-allocator model against sequences worked out by hand from CUDACachingAllocator.cpp's rules.

Each test's comment derives the expected reserved / allocated bytes from the rules:
  round to 512 B; ≤ 1 MiB → small pool, 2 MiB segments; < 10 MiB → 20 MiB segment; else round up to 2 MiB;
  best fit by (size, address); split small-pool blocks when ≥ 512 B remain, large-pool blocks only when
  > 1 MiB remains and the request is under max_split_size.
"""

import random

import pytest

from engine.core.errors import UserError
from engine.cuda.allocator import (
    AllocatorSettings,
    CachingAllocatorModel,
    allocation_size,
    parse_alloc_conf,
    round_size,
)
from engine.cuda.allocator_replay import AllocPair, replay
from engine.results.types import MemEvent

KiB, MiB = 1024, 1024**2


def A(sid, n):
    return AllocPair(sid, n)


def F(sid):
    return AllocPair(sid, -1)


def test_rounding_and_segment_sizes():
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert allocation_size(1 * MiB) == 2 * MiB  # small pool
    assert allocation_size(1 * MiB + 512) == 20 * MiB  # 1–10 MiB share 20 MiB segments
    assert allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB  # ≥ 10 MiB: rounded to 2 MiB
    assert allocation_size(11 * MiB) == 12 * MiB


def test_small_pool_packs_into_2mib_segments():
    # 1000 B → 1024 B block from a new 2 MiB segment (split: 2 MiB − 1 KiB free remains).
    # 1 MiB → fits the 2 MiB − 1 KiB free block, split → still one segment, reserved 2 MiB.
    # another 1 MiB → the remaining 1 MiB − 1 KiB is too small → a second 2 MiB segment: reserved 4 MiB.
    r = replay([A(1, 1000), A(2, MiB), A(3, MiB)])
    assert list(r.reserved) == [2 * MiB, 2 * MiB, 4 * MiB]
    assert list(r.allocated) == [1024, 1024 + MiB, 1024 + 2 * MiB]
    assert r.max_segments == 2


def test_large_pool_splits_20mib_segment_and_keeps_small_remainders():
    # 1.5 MiB → new 20 MiB segment, split (18.5 MiB > 1 MiB remains).
    # 5 MiB → from the 18.5 MiB block, split (13.5 remains). 12 MiB → from 13.5, split (1.5 remains).
    # 1.2 MiB → best fit is the 1.5 MiB block; 0.3 MiB remains, not > 1 MiB → not split: the whole
    # 1.5 MiB block is allocated. So memory_allocated = 20 MiB while the requests add up to 19.7 MiB.
    seq = [A(1, 3 * MiB // 2), A(2, 5 * MiB), A(3, 12 * MiB), A(4, 6 * MiB // 5 // 512 * 512)]
    r = replay(seq)
    assert list(r.reserved) == [20 * MiB] * 4
    assert r.allocated[-1] == 20 * MiB
    assert r.requested[-1] == 3 * MiB // 2 + 5 * MiB + 12 * MiB + 6 * MiB // 5 // 512 * 512
    assert r.segments_at_peak == 1


def test_large_requests_round_to_2mib_and_reuse_best_fit():
    # 11 MiB → 12 MiB segment; 1 MiB remains, not > 1 MiB → unsplit, allocated 12 MiB.
    # free → cached. 10.5 MiB → reuses the 12 MiB block, 1.5 MiB remains → split: allocated 10.5 MiB.
    # 25 MiB → nothing cached fits → 26 MiB segment: reserved 12 + 26 = 38 MiB; 1 MiB remains, not > 1 MiB
    # → unsplit: allocated 10.5 + 26 MiB.
    r = replay([A(1, 11 * MiB), F(1), A(2, 21 * MiB // 2), A(3, 25 * MiB)])
    assert list(r.reserved) == [12 * MiB, 12 * MiB, 12 * MiB, 38 * MiB]
    assert list(r.allocated) == [12 * MiB, 0, 21 * MiB // 2, 21 * MiB // 2 + 26 * MiB]
    assert r.cuda_mallocs == 2


def test_fragmentation_then_merge_on_free():
    # A 8 MiB, B 8 MiB, C 4 MiB carve one 20 MiB segment exactly (A 0–8, B 8–16, C 16–20).
    # Free A and C: 8 and 4 MiB holes that cannot hold 12 MiB → new 12 MiB segment: reserved 32 MiB,
    # allocated 8 + 12 = 20 MiB → 12 MiB of fragmentation.
    # Free B: A, B, C merge into one free 20 MiB block; 16 MiB fits it (4 MiB remains, split): no new segment.
    seq = [A(1, 8 * MiB), A(2, 8 * MiB), A(3, 4 * MiB), F(1), F(3), A(4, 12 * MiB), F(2), A(5, 16 * MiB)]
    r = replay(seq)
    assert r.reserved[2] == 20 * MiB
    assert r.reserved[5] == 32 * MiB and r.allocated[5] == 20 * MiB
    assert r.max_cached == 20 * MiB  # after B is freed: 32 reserved, 12 allocated
    assert r.reserved[-1] == 32 * MiB and r.allocated[-1] == 28 * MiB
    assert r.peak_reserved == 32 * MiB and r.cached_at_peak == 12 * MiB


def test_max_split_size_keeps_oversize_blocks_whole():
    # Default: 30 MiB segment cached; an 8 MiB request splits it → reserved stays 30 MiB.
    seq = [A(1, 30 * MiB), F(1), A(2, 8 * MiB)]
    assert replay(seq).peak_reserved == 30 * MiB
    # max_split_size_mb:20: the 30 MiB block is oversize and an 8 MiB request may not take it
    # → a new 20 MiB segment: reserved 50 MiB.
    assert replay(seq, "max_split_size_mb:20").peak_reserved == 50 * MiB
    # An oversize request may take a cached oversize block less than 20 MiB larger (25 → 30 MiB block,
    # whole, unsplit: allocated 30 MiB) but not one 20 MiB or more larger (24 MiB vs a 46 MiB block).
    r = replay([A(1, 30 * MiB), F(1), A(2, 25 * MiB)], "max_split_size_mb:20")
    assert r.peak_reserved == 30 * MiB and r.allocated[-1] == 30 * MiB
    r = replay([A(1, 46 * MiB), F(1), A(2, 24 * MiB)], "max_split_size_mb:20")
    assert r.peak_reserved == 70 * MiB


def test_oversize_blocks_released_before_oom():
    # Capacity 40 MiB, max_split 20 MiB: 30 MiB cached, oversize. 8 MiB cannot take it and a new 20 MiB
    # segment would make 50 > 40 → PyTorch frees the cached oversize block (release_available_cached_blocks)
    # and retries: reserved 20 MiB, no OOM.
    r = replay([A(1, 30 * MiB), F(1), A(2, 8 * MiB)], "max_split_size_mb:20", capacity=40 * MiB)
    assert r.oom_index is None
    assert r.reserved[-1] == 20 * MiB and r.cuda_frees == 1


def test_oom_recorded_at_the_event():
    # Capacity 50 MiB: 30 MiB fits, a second 30 MiB needs 60 MiB with nothing cached to free → OOM at event 1.
    r = replay([A(1, 30 * MiB), A(2, 30 * MiB)], capacity=50 * MiB)
    assert r.oom_index == 1 and r.oom_request_bytes == 30 * MiB and r.oom_reserved_bytes == 30 * MiB


def test_cached_segments_freed_before_oom_without_max_split():
    # Capacity 64 MiB: two 30 MiB segments cached; a 40 MiB request fits none and 60 + 40 > 64 →
    # release_cached_blocks frees both unsplit segments, then 40 MiB fits: reserved 40 MiB.
    r = replay([A(1, 30 * MiB), A(2, 30 * MiB), F(1), F(2), A(3, 40 * MiB)], capacity=64 * MiB)
    assert r.oom_index is None
    assert r.reserved[-1] == 40 * MiB and r.peak_reserved == 60 * MiB


def test_expandable_segments_grow_one_segment_in_20mib_pages():
    # 30 MiB → maps 2 pages (40 MiB); split (expandable blocks split whenever ≥ 512 B remain): 10 MiB free.
    # 15 MiB → no free block ≥ 15 MiB; the 10 MiB free block sits before the unmapped tail, so one more
    # 20 MiB page is mapped and merged: a 30 MiB free block, split → 15 MiB remain free. Reserved 60 MiB,
    # one segment. Freeing both and emptying the cache unmaps every page.
    seq = [A(1, 30 * MiB), A(2, 15 * MiB)]
    r = replay(seq, "expandable_segments:True")
    assert list(r.reserved) == [40 * MiB, 60 * MiB]
    assert r.max_segments == 1
    m = CachingAllocatorModel(parse_alloc_conf("expandable_segments:True"))
    b1, b2 = m.malloc(30 * MiB), m.malloc(15 * MiB)
    m.free(b1)
    m.free(b2)
    assert m.reserved == 60 * MiB and m.allocated == 0
    m.empty_cache()
    assert m.reserved == 0 and m.segments == 0


def test_expandable_segments_avoid_growth_fragmentation():
    # Growing requests 21, 23, 25 MiB, each freed before the next (batch sizes creeping up):
    # default: 22 MiB segment, then 24 (22 cached is too small), then 26 → 72 MiB reserved.
    # expandable: pages of 20 MiB: 21 → 40 MiB mapped; 23 and 25 fit the merged free 40 MiB → 40 MiB.
    seq = [A(1, 21 * MiB), F(1), A(2, 23 * MiB), F(2), A(3, 25 * MiB)]
    assert replay(seq).peak_reserved == 72 * MiB
    assert replay(seq, "expandable_segments:True").peak_reserved == 40 * MiB


def test_garbage_collection_needs_a_memory_fraction():
    # Two 30 MiB segments cached, then 40 MiB. Without GC: 60 + 40 = 100 MiB reserved.
    # With garbage_collection_threshold:0.5 and a memory fraction of 1.0 of a 100 MiB device, the limit is
    # 100 MiB and GC starts above 50 MiB: reserved 60 > 50, both cached blocks are as old as the average
    # (1 get_free_block call since they were cached) → both freed → reserved 40 MiB.
    seq = [A(1, 30 * MiB), A(2, 30 * MiB), F(1), F(2), A(3, 40 * MiB)]
    assert replay(seq, "garbage_collection_threshold:0.5").peak_reserved == 100 * MiB  # no fraction: inert
    r = replay(seq, "garbage_collection_threshold:0.5", memory_fraction=1.0, device_total=100 * MiB)
    assert r.reserved[-1] == 40 * MiB and r.peak_reserved == 60 * MiB


def test_requested_peak_equals_live_peak_rounded():
    rng = random.Random(7)
    events, live, idx = [], {}, 0
    for sid in range(3000):
        n = rng.choice([rng.randint(1, 4096), rng.randint(4096, 2 * MiB), rng.randint(2 * MiB, 64 * MiB)])
        events.append(MemEvent(idx, sid, n, "activations", 0, "forward", "", "op"))
        idx += 1
        live[sid] = n
        if live and rng.random() < 0.5:
            victim = rng.choice(list(live))
            events.append(MemEvent(idx, victim, -live.pop(victim), "activations", 0, "forward", "", "op"))
            idx += 1
    r = replay(events)
    total = peak = 0
    for ev in events:
        total += (ev.nbytes + 511) // 512 * 512 if ev.nbytes > 0 else -((-ev.nbytes + 511) // 512 * 512)
        peak = max(peak, total)
    assert r.peak_requested == peak
    assert r.peak_allocated >= peak  # unsplit blocks can be larger than the request
    assert r.peak_reserved >= r.peak_allocated
    assert all(res >= al for res, al in zip(r.reserved, r.allocated, strict=False))
    assert len(r.reserved) == len(events)


def test_parse_alloc_conf():
    s = parse_alloc_conf("max_split_size_mb:128, expandable_segments:True,garbage_collection_threshold:0.6")
    assert s.max_split_size == 128 * MiB and s.expandable_segments and s.garbage_collection_threshold == 0.6
    assert parse_alloc_conf("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16
    d = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").roundup_power2_divisions
    # '>' fills from the last named interval onwards (PyTorch's std::fill from last_index), overriding 1024's 4
    assert d[8] == 1 and d[9] == 2 and d[10] == 8 and d[15] == 8 and d[0] == 1
    assert parse_alloc_conf(None) == AllocatorSettings()
    for bad in ("max_split_size_mb:10", "expandable_segments:yes", "garbage_collection_threshold:1.5",
                "max_split_sise_mb:64", "max_split_size_mb", "roundup_power2_divisions:3"):
        with pytest.raises(UserError):
            parse_alloc_conf(bad)


def test_roundup_power2_divisions():
    # Divisions apply only when size > 512 × divisions: 1200 B with 4 divisions is rounded to 512 B steps (1536).
    s = parse_alloc_conf("roundup_power2_divisions:4")
    assert round_size(1200, s) == 1536
    # 1 MiB + 1 with 4 divisions of [1, 2) MiB → 1.25 MiB
    assert round_size(MiB + 1, s) == MiB + MiB // 4
    # 5 MiB + 1 between 4 and 8 MiB with 4 divisions → 6 MiB
    assert round_size(5 * MiB + 1, s) == 6 * MiB


def test_new_segments_below_old_ones_so_best_fit_reuses_the_newest():
    # Two 30 MiB segments cached; a 29 MiB request fits both; best fit takes the lower address, and cudaMalloc
    # (on the H200 traces in tests/data) placed each new segment below the earlier ones: the newest is reused.
    m = CachingAllocatorModel()
    first, second = m.malloc(30 * MiB), m.malloc(30 * MiB)
    assert second.addr < first.addr
    m.free(first)
    m.free(second)
    assert m.malloc(29 * MiB).addr == second.addr
    assert m.segment_sizes() == [30 * MiB, 30 * MiB]
