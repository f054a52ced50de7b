"""Snapshot pickles that cost far more than their size (issue 26): a memo index of millions (`LONG_BINPUT`,
`PUT`), ten million memo entries or a list of millions built by `APPENDS` from a few kilobytes of gzip. Each is one
line and exit 2, read in bounded memory; before, the LONG_BINPUT one took 50 s and 4.4 GiB here."""

from __future__ import annotations

import gzip
import struct
import sys
from pathlib import Path

import pytest

from engine.core.errors import UserError
from engine.snapshots.file import load_snapshot_file
from main import main

DATA = Path(__file__).parent / "data"
LINUX = sys.platform.startswith("linux")


def _peak_rss_kib() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _write(tmp_path: Path, name: str, body: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(gzip.compress(body, 9) if name.endswith(".gz") else body)
    return p


# each index asks the C unpickler for a memo array of 2 x index pointers: 1 GiB, past the 512 MiB floor
MEMO_INDEX = 0x03FF_FFFF


@pytest.mark.skipif(not LINUX, reason="the address-space ceiling is Linux's RLIMIT_AS")
@pytest.mark.parametrize("name, body", [
    ("long_binput.pickle", b"\x80\x02}r" + struct.pack("<I", MEMO_INDEX) + b"."),
    ("put.pickle", b"(dp" + str(MEMO_INDEX).encode() + b"\n."),
])
def test_a_huge_memo_index_is_refused_within_the_memory_ceiling(tmp_path, capsys, name, body):
    import resource

    before = resource.getrlimit(resource.RLIMIT_AS)
    rss = _peak_rss_kib()
    p = _write(tmp_path, name, body)
    with pytest.raises(UserError) as e:
        load_snapshot_file(p)
    assert "ask for more than 512.00 MiB of memory" in str(e.value) and "huge memo or list" in str(e.value)
    assert resource.getrlimit(resource.RLIMIT_AS) == before  # the ceiling is put back
    assert _peak_rss_kib() - rss < 600 * 1024  # the 1 GiB memo was never taken
    assert main(["open", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("name, body", [
    ("memo_10m.pickle.gz", b"\x80\x04" + b"N\x94" * 10_000_000 + b"."),
    ("appends.pickle.gz", b"\x80\x02](" + b"N" * 40_000_000 + b"e."),
])
def test_a_gzip_that_unpacks_to_far_more_than_a_snapshot_is_refused(tmp_path, name, body):
    p = _write(tmp_path, name, body)
    with pytest.raises(UserError, match=r"unpack to more than 16,777,216 bytes \(real snapshots compress"):
        load_snapshot_file(p)


@pytest.mark.skipif(not LINUX, reason="RLIMIT_AS is set on Linux only")
def test_real_snapshots_still_open_and_the_ceiling_is_put_back():
    import resource

    before = resource.getrlimit(resource.RLIMIT_AS)
    for p in sorted(DATA.glob("*.pickle.gz")):
        assert load_snapshot_file(p)["segments"]
    assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_a_plain_pickle_of_ten_million_memo_entries_costs_memory_in_proportion(tmp_path):
    # 20 MB of pickle, not gzipped: read (it is in proportion to its size), then refused for its layout
    p = _write(tmp_path, "memo_10m.pickle", b"\x80\x04" + b"N\x94" * 10_000_000 + b".")
    with pytest.raises(UserError, match="is a pickle but not a PyTorch memory snapshot"):
        load_snapshot_file(p)


@pytest.mark.skipif(not LINUX, reason="RLIMIT_AS is set on Linux only")
def test_a_second_ceiling_meanwhile_is_none_and_the_first_is_put_back():
    import resource

    from engine.core.memory_budget import memory_budget

    before = resource.getrlimit(resource.RLIMIT_AS)
    with memory_budget(1 << 30) as first:
        assert first.active and resource.getrlimit(resource.RLIMIT_AS)[0] != before[0]
        with memory_budget(1 << 30) as second:  # another thread's read, say: no ceiling of its own
            assert not second.active
        assert resource.getrlimit(resource.RLIMIT_AS) != before  # the first one's still holds
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    with memory_budget(1 << 30) as again:
        assert again.active
    assert resource.getrlimit(resource.RLIMIT_AS) == before
