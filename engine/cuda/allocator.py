"""A model of PyTorch's CUDA caching allocator, replayed over a trace's allocations and frees.

It predicts what `torch.cuda.max_memory_reserved()` / `max_memory_allocated()` report: block rounding, the small
and large pools, segment sizes, best-fit reuse with splitting, `max_split_size_mb`, `expandable_segments` and
`garbage_collection_threshold`, following c10/cuda/CUDACachingAllocator.cpp (one stream, no CUDA graphs).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.errors import UserError

# The allocator's constants (CUDACachingAllocator.cpp).
MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to a multiple of 512 bytes
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to 1 MiB go to the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: the small pool takes 2 MiB segments
LARGE_BUFFER = 20 << 20  # kLargeBuffer: requests under 10 MiB take 20 MiB segments
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge: larger requests get a segment rounded up to 2 MiB
_MB = 1 << 20
_UNLIMITED = 1 << 62  # "SIZE_MAX": max_split_size when not set
_PAGE_SMALL = SMALL_BUFFER  # expandable segments map 2 MiB pages in the small pool …
_PAGE_LARGE = LARGE_BUFFER  # … and 20 MiB pages in the large pool
_POW2_START_LOG = 20  # roundup_power2_divisions intervals: 1 MiB … 64 GiB, 16 of them
_POW2_INTERVALS = 16


# --------------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class AllocatorSettings:
    """The options of PYTORCH_CUDA_ALLOC_CONF that change how much memory is reserved."""

    max_split_size: int = _UNLIMITED  # bytes; blocks this large or larger are never split
    max_non_split_rounding: int = LARGE_BUFFER  # an oversize request may take a cached block this much larger
    garbage_collection_threshold: float = 0.0  # acts only with a per-process memory fraction (as in PyTorch)
    expandable_segments: bool = False
    roundup_power2_divisions: tuple[int, ...] = (0,) * _POW2_INTERVALS
    backend: str = "native"  # "native" | "cudaMallocAsync" (the latter is not modelled)

    @property
    def max_split_set(self) -> bool:
        return self.max_split_size < _UNLIMITED


_BOOL = {"True": True, "False": False, "true": True, "false": False, "1": True, "0": False}
_IGNORED_KEYS = {  # accepted by PyTorch but irrelevant to device memory
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
}
_KNOWN_KEYS = (
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "expandable_segments",
    "roundup_power2_divisions",
    "backend",
) + tuple(sorted(_IGNORED_KEYS))


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside [...] (roundup_power2_divisions takes a bracketed list)."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def parse_alloc_conf(text: str | None) -> AllocatorSettings:
    """Parse a PYTORCH_CUDA_ALLOC_CONF string ('max_split_size_mb:128,expandable_segments:True').

    Raises UserError naming the bad option, with the same limits PyTorch enforces.
    """
    if not text or not text.strip():
        return AllocatorSettings()
    import difflib

    where = "allocator config"
    values: dict[str, Any] = {}
    for item in _split_top(text.replace(" ", "")):
        key, sep, value = item.partition(":")
        if not sep or not value:
            raise UserError(f"option '{item}' needs a value, as in 'max_split_size_mb:128'", where=where)
        if key in _IGNORED_KEYS:
            continue
        try:
            if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
                mb = int(value)
                if mb < LARGE_BUFFER // _MB:
                    raise UserError(f"{key} must be at least {LARGE_BUFFER // _MB}, got {mb}", where=where)
                values["max_split_size" if key.startswith("max_split") else "max_non_split_rounding"] = mb * _MB
            elif key == "garbage_collection_threshold":
                v = float(value)
                if not 0.0 < v < 1.0:
                    raise UserError(f"garbage_collection_threshold must be between 0 and 1, got {value}", where=where)
                values["garbage_collection_threshold"] = v
            elif key == "expandable_segments":
                if value not in ("True", "False"):
                    raise UserError(f"expandable_segments takes True or False, got '{value}'", where=where)
                values["expandable_segments"] = value == "True"
            elif key == "roundup_power2_divisions":
                values["roundup_power2_divisions"] = _parse_divisions(value, where)
            elif key == "backend":
                if value not in ("native", "cudaMallocAsync"):
                    raise UserError(f"backend must be 'native' or 'cudaMallocAsync', got '{value}'", where=where)
                values["backend"] = value
            else:
                close = difflib.get_close_matches(key, _KNOWN_KEYS, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise UserError(f"unknown option '{key}'{hint}", where=where)
        except ValueError:
            raise UserError(f"option '{key}' has a value that is not a number: '{value}'", where=where) from None
    return AllocatorSettings(**values)


def _parse_divisions(value: str, where: str) -> tuple[int, ...]:
    divs = [0] * _POW2_INTERVALS
    if not value.startswith("["):
        n = int(value)
        if not _is_pow2(n):
            raise UserError(f"roundup_power2_divisions must be a power of 2, got {n}", where=where)
        return (n,) * _POW2_INTERVALS
    body = value.strip("[]")
    first, last_index = True, 0
    for entry in filter(None, body.split(",")):
        size_s, _, n_s = entry.partition(":")
        n = int(n_s)
        if n != 0 and not _is_pow2(n):
            raise UserError(f"roundup_power2_divisions values must be 0 or a power of 2, got {n}", where=where)
        if size_s == ">":
            for i in range(last_index, _POW2_INTERVALS):
                divs[i] = n
            continue
        size_mb = int(size_s)
        if not _is_pow2(size_mb):
            raise UserError(f"roundup_power2_divisions intervals must be powers of 2, got {size_mb}", where=where)
        index = min(max(size_mb.bit_length() - 1, 0), _POW2_INTERVALS - 1)
        if first:
            for i in range(index):
                divs[i] = n
            first = False
        divs[index] = n
        last_index = index
    return tuple(divs)


# --------------------------------------------------------------------------------------------------- sizes


def _divisions_for(size: int, s: AllocatorSettings) -> int:
    index = (size.bit_length() - 1) - _POW2_START_LOG
    index = min(max(index, 0), _POW2_INTERVALS - 1)
    return s.roundup_power2_divisions[index]


def round_size(nbytes: int, settings: AllocatorSettings | None = None) -> int:
    """The block size PyTorch gives a request of `nbytes` (round_size)."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    if settings is not None:
        divisions = _divisions_for(nbytes, settings)
        if divisions > 1 and nbytes > MIN_BLOCK * divisions:
            if _is_pow2(nbytes):
                return nbytes
            floor = 1 << (nbytes.bit_length() - 1)
            step = floor >> (divisions.bit_length() - 1)
            if step == 0:
                return floor << 1
            rounded = nbytes & ~(step - 1)
            return nbytes if rounded == nbytes else rounded + step
    return MIN_BLOCK * ((nbytes + MIN_BLOCK - 1) // MIN_BLOCK)


def allocation_size(size: int) -> int:
    """The segment cudaMalloc'd for a rounded request that no cached block can serve (get_allocation_size)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


# --------------------------------------------------------------------------------------------------- the model


class Block:
    """One block of a segment: allocated to a tensor, or cached (free) in its pool."""

    __slots__ = ("addr", "size", "small", "allocated", "prev", "next", "mapped", "expandable", "gc_base", "key")

    def __init__(self, addr: int, size: int, small: bool, expandable: bool = False, mapped: bool = True):
        self.addr = addr
        self.size = size
        self.small = small
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None
        self.mapped = mapped
        self.expandable = expandable
        self.gc_base = 0
        self.key: int | None = None  # its place in its pool while cached (_Pool.insert)

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """Free (cached) blocks of one pool, ordered by (size, address) as PyTorch's std::set is: each block's key is
    the one integer `size << 64 | address` (addresses are under 2**64), which sorts the same and compares faster
    than the pair."""

    def __init__(self, small: bool):
        self.small = small
        self.keys: list[int] = []  # size << 64 | address, sorted
        self.blocks: dict[int, Block] = {}
        self.get_free_calls = 0

    def insert(self, b: Block) -> None:
        key = b.key = b.size << 64 | b.addr
        b.gc_base = self.get_free_calls
        insort(self.keys, key)
        self.blocks[key] = b

    def remove(self, b: Block) -> None:
        key = b.key
        if key is None:
            return
        i = bisect_left(self.keys, key)
        if i < len(self.keys) and self.keys[i] == key:
            del self.keys[i]
            del self.blocks[key]
        b.key = None

    def take(self, i: int) -> Block:
        """The block at position `i` of the order, out of the pool."""
        key = self.keys.pop(i)
        b = self.blocks.pop(key)
        b.key = None
        return b

    def lower_bound(self, size: int) -> int:
        """The position of the smallest cached block of at least `size` bytes (the lowest address among equals)."""
        return bisect_left(self.keys, size << 64)


class OutOfMemory(Exception):
    def __init__(self, request: int):
        self.request = request


class CachingAllocatorModel:
    """One device's caching allocator, one stream. Sizes are bytes; addresses are virtual."""

    def __init__(
        self,
        settings: AllocatorSettings | None = None,
        *,
        capacity: int | None = None,
        memory_fraction: float | None = None,
        device_total: int | None = None,
        segment_address: Callable[[int, bool], int | None] | None = None,
    ) -> None:
        self.s = settings or AllocatorSettings()
        self._round_settings = self.s if any(self.s.roundup_power2_divisions) else None
        self._plain = not self.s.expandable_segments  # (malloc_rounded's inline path: no expandable blocks …)
        self._no_gc = self.s.garbage_collection_threshold <= 0.0  # (… and no garbage collection's count)
        self._max_split, self._max_non_split = self.s.max_split_size, self.s.max_non_split_rounding
        # capacity: what cudaMalloc can still get (device free memory); memory_fraction × device_total is the
        # limit set_per_process_memory_fraction sets, and the only case where garbage collection acts.
        self.capacity = capacity
        self.allowed_max = None
        if memory_fraction is not None and device_total:
            self.allowed_max = int(memory_fraction * device_total)
        self.small = _Pool(True)
        self.large = _Pool(False)
        self.reserved = 0
        self.allocated = 0  # sum of allocated block sizes = torch.cuda.memory_allocated()
        self.requested = 0  # sum of 512-rounded request sizes
        self.segments = 0  # cudaMalloc'd segments alive (contiguous mapped ranges for expandable segments)
        self.cuda_mallocs = 0
        self.cuda_frees = 0
        self._next_addr = 1 << 40  # expandable segments' address space (grows upwards)
        # cudaMalloc hands each new segment an address below the earlier ones (CUDA's virtual address allocator
        # on the H200 traces in tests/data): best fit breaks ties between equal sizes by address, so the order
        # matters. A replay of a real trace passes the real addresses instead.
        self._seg_top = 1 << 62
        self._segments: dict[int, int] = {}  # cudaMalloc'd segments alive: address → size
        self.segment_address = segment_address
        # expandable segments: one per pool, a linked list starting at its first block
        self._exp_base: dict[bool, int] = {}
        self._exp_unmapped: dict[bool, list[Block]] = {True: [], False: []}

    # ---- public API
    def malloc(self, nbytes: int) -> Block:
        return self.malloc_rounded(round_size(nbytes, self._round_settings))

    def malloc_rounded(self, size: int) -> Block:
        """malloc of a request already rounded (round_size with these settings: the replay keeps the figure)."""
        pool = self.small if size <= SMALL_SIZE else self.large
        if self._plain and (self._no_gc or self.allowed_max is None):
            # _get_free_block and _alloc_found_block inline, where no block is expandable and garbage collection
            # keeps no count (a replay makes tens of thousands of these calls)
            keys = pool.keys
            i = bisect_left(keys, size << 64)
            if i < len(keys):
                key = keys[i]
                found = key >> 64
                ms = self._max_split
                if not ((size < ms and found >= ms) or (size >= ms and found >= size + self._max_non_split)):
                    del keys[i]
                    b = pool.blocks.pop(key)
                    b.key = None
                    rest = found - size
                    if rest >= MIN_BLOCK if b.small else (size < ms and rest > SMALL_SIZE):
                        c = Block(b.addr, size, b.small)
                        c.prev = p = b.prev
                        if p is not None:
                            p.next = c
                        c.next = b
                        b.prev = c
                        b.addr += size
                        b.size = rest
                        pool.insert(b)
                        b = c
                    b.allocated = True
                    self.allocated += b.size
                    return b
            block = None
        else:
            block = self._get_free_block(pool, size)
        if block is None:
            if self.allowed_max is not None and self.s.garbage_collection_threshold > 0.0:
                self._garbage_collect()
            alloc = allocation_size(size)
            block = self._alloc_block(pool, size, alloc)
            if block is None and self._release_available_cached_blocks(pool, size):
                block = self._alloc_block(pool, size, alloc)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(pool, size, alloc)
            if block is None:
                raise OutOfMemory(alloc)
        return self._alloc_found_block(pool, block, size)

    def free(self, b: Block) -> None:
        b.allocated = False
        self.allocated -= b.size
        pool = self.small if b.small else self.large
        prev, nxt = b.prev, b.next
        if prev is not None and not prev.allocated:  # (_try_merge's own test, made here: most neighbours are busy)
            self._try_merge(b, prev, pool)
        if nxt is not None and not nxt.allocated:
            self._try_merge(b, nxt, pool)
        pool.insert(b)

    def empty_cache(self) -> None:
        self._release_cached_blocks()

    def segment_sizes(self) -> list[int]:
        """The sizes of the cudaMalloc'd segments alive now (not expandable ones), by address."""
        return [self._segments[a] for a in sorted(self._segments)]

    @property
    def fragmentation(self) -> int:
        return self.reserved - self.allocated

    # ---- finding a cached block
    def _get_free_block(self, pool: _Pool, size: int) -> Block | None:
        if self.allowed_max is not None and self.s.garbage_collection_threshold > 0.0:
            pool.get_free_calls += 1
        keys = pool.keys
        i = bisect_left(keys, size << 64)  # pool.lower_bound(size)
        if i >= len(keys):
            return None
        b = pool.blocks[keys[i]]
        if b.expandable:
            # An expandable block is as big as it can grow: prefer the block that can grow least.
            def exp_size(x: Block) -> int:
                return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)

            j = i + 1
            while b.expandable and j < len(keys):
                nb = pool.blocks[keys[j]]
                if exp_size(nb) < exp_size(b):
                    b, i = nb, j
                    j += 1
                else:
                    break
        ms = self.s.max_split_size
        # Do not hand an oversize block to a small request, and let an oversize request take a cached block
        # only when it is at most max_non_split_rounding larger.
        if size < ms and b.size >= ms:
            return None
        if size >= ms and b.size >= size + self.s.max_non_split_rounding:
            return None
        return pool.take(i)

    def _should_split(self, b: Block, size: int) -> bool:
        remaining = b.size - size
        if b.small or self.s.expandable_segments:
            return remaining >= MIN_BLOCK
        return size < self.s.max_split_size and remaining > SMALL_SIZE

    def _alloc_found_block(self, pool: _Pool, b: Block, size: int) -> Block:
        if self._should_split(b, size):
            rest = b
            b = Block(rest.addr, size, rest.small, rest.expandable)
            b.prev = rest.prev
            if b.prev is not None:
                b.prev.next = b
            b.next = rest
            rest.prev = b
            rest.addr += size
            rest.size -= size
            pool.insert(rest)
        b.allocated = True
        self.allocated += b.size
        return b

    # ---- getting new memory
    def _fits(self, nbytes: int) -> bool:
        if self.allowed_max is not None and self.reserved + nbytes > self.allowed_max:
            return False
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _alloc_block(self, pool: _Pool, size: int, alloc: int) -> Block | None:
        if self.s.expandable_segments:
            if self.allowed_max is not None and self.reserved + alloc > self.allowed_max:
                return None
            return self._alloc_expandable(pool, size)
        if not self._fits(alloc):
            return None
        addr = self.segment_address(alloc, pool.small) if self.segment_address is not None else None
        if addr is None:
            self._seg_top -= alloc + (1 << 30)  # segments are not contiguous
            addr = self._seg_top
        b = Block(addr, alloc, pool.small)
        self._segments[addr] = alloc
        self.reserved += alloc
        self.segments += 1
        self.cuda_mallocs += 1
        return b

    def _release_block(self, b: Block) -> None:
        pool = self.small if b.small else self.large
        pool.remove(b)
        del self._segments[b.addr]
        self.reserved -= b.size
        self.segments -= 1
        self.cuda_frees += 1

    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        """Free oversize cached blocks, just enough for this request (only when max_split_size is set)."""
        if not self.s.max_split_set or self.s.expandable_segments:
            return False
        key = max(size, self.s.max_split_size)
        i = pool.lower_bound(key)
        if i < len(pool.keys):
            b = pool.blocks[pool.keys[i]]
            if b.is_split:
                return False
            self._release_block(b)
            return True
        released = 0
        j = len(pool.keys) - 1
        while released < key and j >= 0:
            b = pool.blocks[pool.keys[j]]
            if b.size < self.s.max_split_size:
                break
            j -= 1
            if not b.is_split:
                released += b.size
                self._release_block(b)
        return released >= key

    def _release_cached_blocks(self) -> bool:
        """Free every cached segment that is wholly free (what PyTorch does before giving up with an OOM)."""
        for pool in (self.large, self.small):
            for key in list(pool.keys):
                b = pool.blocks.get(key)
                if b is None:
                    continue
                if b.expandable:
                    self._unmap(b, pool)
                elif not b.is_split:
                    self._release_block(b)
        return True

    def _garbage_collect(self) -> None:
        if self.allowed_max is None:
            return
        threshold = int(self.s.garbage_collection_threshold * self.allowed_max)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        pool = self.large
        freeable = [pool.blocks[k] for k in pool.keys if not pool.blocks[k].is_split]
        if not freeable:
            return
        total_age = sum(pool.get_free_calls - b.gc_base for b in freeable)
        count = len(freeable)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            avg = total_age / count
            freed = False
            for k in list(pool.keys):
                b = pool.blocks.get(k)
                if b is None or b.is_split:
                    continue
                age = pool.get_free_calls - b.gc_base
                if age >= avg:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b)

    # ---- expandable segments
    def _page(self, small: bool) -> int:
        return _PAGE_SMALL if small else _PAGE_LARGE

    def _exp_segment(self, small: bool) -> None:
        if small not in self._exp_base:
            # PyTorch reserves 1 1/8 of the device's memory as address space; only relative sizes matter here
            space = (self.capacity or (192 << 30)) * 9 // 8
            page = self._page(small)
            space = (space + page - 1) // page * page
            head = Block(self._next_addr, space, small, expandable=True, mapped=False)
            self._next_addr += space + (1 << 40)
            self._exp_base[small] = head.addr
            self._exp_unmapped[small].append(head)

    def _alloc_expandable(self, pool: _Pool, size: int) -> Block | None:
        self._exp_segment(pool.small)
        cand = self._find_expandable_block(pool.small, size)
        if cand is None and self.capacity is None and self.allowed_max is None:
            # unbounded (a replay going on past an out-of-memory point): the address space reserved for a bounded
            # device is not a limit any more
            self._extend_expandable(pool.small, size)
            cand = self._find_expandable_block(pool.small, size)
        if cand is None:
            return None
        if not cand.mapped:
            got = self._map(cand, min(cand.size, size), pool)
            if got is None:
                return None
            cand = got
        while cand.size < size:
            nxt = cand.next
            if nxt is None:
                return None
            got = self._map(nxt, min(size - cand.size, nxt.size), pool)
            if got is None:
                return None
            cand = got
        pool.remove(cand)
        return cand

    def _extend_expandable(self, small: bool, size: int) -> None:
        """More address space for the pool: a new unmapped range of at least `size` (whole pages, aligned to the
        pool's pages from its first range's base), past every range so far."""
        page = self._page(small)
        base = self._exp_base[small]
        grow = -(-max(size, 64 << 30) // page) * page
        start = base + -(-(self._next_addr - base) // page) * page
        self._next_addr = start + grow + (1 << 40)
        self._exp_unmapped[small].append(Block(start, grow, small, expandable=True, mapped=False))

    def _find_expandable_block(self, small: bool, size: int) -> Block | None:
        def allocatable(b: Block | None) -> bool:
            return b is not None and not b.allocated

        for u in sorted(self._exp_unmapped[small], key=lambda x: x.addr):
            c = u.prev if allocatable(u.prev) else u
            total, x = 0, c
            while total < size and x is not None and not x.allocated:
                total += x.size
                x = x.next
            if total >= size:
                return c
        return None

    def _map(self, u: Block, nbytes: int, pool: _Pool) -> Block | None:
        """Map whole pages at the start of the unmapped block u to cover nbytes; returns the merged free block."""
        page = self._page(u.small)
        mapped = (nbytes + page - 1) // page * page
        if not self._fits(mapped):
            return None
        self._exp_unmapped[u.small].remove(u)
        if mapped < u.size:
            rest = Block(u.addr + mapped, u.size - mapped, u.small, expandable=True, mapped=False)
            rest.prev, rest.next = u, u.next
            if u.next is not None:
                u.next.prev = rest
            u.next = rest
            self._exp_unmapped[u.small].append(rest)
            u.size = mapped
        u.mapped = True
        # a new range, an extension of one, or the filling of a hole between two
        left = u.prev is not None and u.prev.mapped
        right = u.next is not None and u.next.mapped
        self.segments += 1 - int(left) - int(right)
        for other in (u.prev, u.next):
            if other is not None and other.mapped and not other.allocated:
                pool.remove(other)
                self._merge_into(u, other)
        pool.insert(u)
        self.reserved += mapped
        self.cuda_mallocs += 1
        return u

    def _unmap(self, b: Block, pool: _Pool) -> None:
        """Unmap the whole free pages inside the free mapped block b (on empty_cache or before an OOM)."""
        page = self._page(b.small)
        base = self._exp_base[b.small]
        begin = base + -(-(b.addr - base) // page) * page
        end = base + ((b.addr + b.size - base) // page) * page
        if begin >= end:
            return
        pool.remove(b)
        if begin > b.addr:
            before = Block(b.addr, begin - b.addr, b.small, expandable=True)
            before.prev, before.next = b.prev, b
            if b.prev is not None:
                b.prev.next = before
            b.prev = before
            pool.insert(before)
        if end < b.addr + b.size:
            after = Block(end, b.addr + b.size - end, b.small, expandable=True)
            after.prev, after.next = b, b.next
            if b.next is not None:
                b.next.prev = after
            b.next = after
            pool.insert(after)
        had_left = b.prev is not None and b.prev.mapped
        had_right = b.next is not None and b.next.mapped
        b.addr, b.size, b.mapped = begin, end - begin, False
        self.reserved -= end - begin
        self.cuda_frees += 1
        if had_left and had_right:
            self.segments += 1
        elif not had_left and not had_right:
            self.segments -= 1
        for other in (b.prev, b.next):
            if other is not None and not other.mapped:
                self._exp_unmapped[b.small].remove(other)
                self._merge_into(b, other)
        self._exp_unmapped[b.small].append(b)

    # ---- merging
    def _merge_into(self, dst: Block, src: Block) -> None:
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def _try_merge(self, dst: Block, src: Block | None, pool: _Pool) -> None:
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        pool.remove(src)
        self._merge_into(dst, src)
