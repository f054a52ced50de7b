"""GPU catalogue lookups and the context / workspace table, against figures drivers and PyTorch publish."""

import pytest

from engine.config.gpus import (
    cublas_workspace_bytes,
    cuda_context_bytes,
    find_gpu,
    list_gpus,
    workspace_allocations,
)
from engine.core.errors import UserError

MiB = 1024**2


def test_catalogue_has_the_required_gpus():
    names = {g.name for g in list_gpus()}
    for required in ("A100 40GB", "A100 80GB", "H100 80GB", "H200 141GB", "L4", "L40S", "A10", "T4",
                     "V100 16GB", "V100 32GB", "RTX 3090", "RTX 4090", "RTX 5090"):
        assert required in names


def test_memory_as_the_driver_reports_it():
    # nvidia-smi "Total": H100 80GB HBM3 81559 MiB, H200 143771 MiB, A100 80GB 81920 MiB, RTX 4090 24564 MiB,
    # L4 23034 MiB
    assert find_gpu("H100 80GB HBM3").memory_bytes == 81559 * MiB
    assert find_gpu("h200").memory_bytes == 143771 * MiB
    assert find_gpu("A100-SXM4-80GB").memory_bytes == 81920 * MiB
    assert find_gpu("rtx 4090").memory_bytes == 24564 * MiB
    assert find_gpu("NVIDIA L4").memory_bytes == 23034 * MiB
    # torch reports Tesla T4 total_memory = 15102 MiB of nvidia-smi's 15360 MiB
    t4 = find_gpu("Tesla T4")
    assert t4.usable_bytes == 15102 * MiB and t4.usable_measured
    for g in list_gpus():
        assert 0.95 * g.memory_bytes < g.usable_bytes <= g.memory_bytes


def test_compute_capabilities():
    assert find_gpu("h100").cc == "9.0" and find_gpu("h100").architecture == "hopper"
    assert find_gpu("a100 40gb").cc == "8.0"
    assert find_gpu("t4").cc == "7.5"
    assert find_gpu("v100 32gb").cc == "7.0"
    assert find_gpu("l40s").cc == "8.9"
    assert find_gpu("rtx 5090").cc == "12.0"


def test_fuzzy_lookup_and_errors():
    assert find_gpu("4090").name == "RTX 4090"
    assert find_gpu("GeForce RTX 3090").name == "RTX 3090"
    with pytest.raises(UserError, match="RTX 4090"):
        find_gpu("rtx 4080")
    with pytest.raises(UserError, match="unknown GPU"):
        find_gpu("voodoo2")
    with pytest.raises(UserError, match="several"):
        find_gpu("rtx")


def test_cublas_workspaces_match_pytorch_defaults():
    # CUBLAS_WORKSPACE_CONFIG default ':4096:2:16:8' = 4096*2 + 16*8 KiB before Hopper, ':4096:8' on sm90
    assert cublas_workspace_bytes((8, 0)) == (4096 * 2 + 16 * 8) * 1024 == 8519680
    assert cublas_workspace_bytes((9, 0)) == 4096 * 8 * 1024
    # training: a cuBLAS and a 1 MiB cuBLASLt workspace per handle, on two threads
    assert workspace_allocations((8, 0), training=True) == [8519680, MiB, 8519680, MiB]
    assert workspace_allocations((9, 0), training=False) == [33554432, MiB]


def test_context_is_a_few_hundred_mib_with_lazy_loading():
    # PyTorch PR #86509: 287,047,680 B with lazy loading vs 666,632,192 B eager (CUDA 11.7)
    lazy = cuda_context_bytes("ampere", "11.8")
    eager = cuda_context_bytes("ampere", "11.3")
    assert 250 * MiB <= lazy <= 600 * MiB
    assert eager > 1.5 * lazy
    assert cuda_context_bytes("hopper", "12.4") >= cuda_context_bytes("ampere", "12.4")


def test_every_catalogue_entry_is_complete():
    """A GPU added to resources/gpus.json with a missing or inconsistent figure fails here: every entry resolves
    by its name and aliases, has memory, an architecture and a CUDA context size."""
    from engine.config.gpus import cuda_context_bytes, list_gpus

    for g in list_gpus():
        assert find_gpu(g.name) == g
        for alias in g.aliases:
            assert find_gpu(alias).name == g.name, alias
        assert 0 < g.usable_bytes <= g.memory_bytes
        assert cuda_context_bytes(g.architecture) > 0
        assert g.memory_type, g.name


def test_architectures_follow_the_compute_capability():
    """NVIDIA's architectures by compute capability (the CUDA C Programming Guide's table): the last whose first
    compute capability is not above the GPU's."""
    from engine.config.gpus import architecture_of

    expected = {(7, 0): "volta", (7, 2): "volta", (7, 5): "turing", (8, 0): "ampere", (8, 6): "ampere",
                (8, 7): "ampere", (8, 9): "ada", (9, 0): "hopper", (10, 0): "blackwell", (12, 0): "blackwell",
                (6, 1): "volta"}  # older than the table: its oldest (as before the table)
    assert {cc: architecture_of(cc) for cc in expected} == expected
    assert find_gpu("RTX 5090").architecture == "blackwell" and find_gpu("L4").architecture == "ada"


def test_every_architecture_of_the_catalogue_is_in_every_per_architecture_table():
    """A GPU of a new architecture (or compute capability) fails here until each table that is keyed by one names
    it: resources/gpus.json's architectures (by construction: every GPU gets one), every CUDA row of
    resources/cuda_context.json's context_mib (a figure, or null where that CUDA does not run it) and
    resources/cuda_kernels.json's threads_per_sm (the reduction model's occupancy)."""
    import json

    from engine.config.gpus import RESOURCES, architectures, list_gpus

    context = json.loads((RESOURCES / "cuda_context.json").read_text(encoding="utf-8"))["context_mib"]
    kernels = json.loads((RESOURCES / "cuda_kernels.json").read_text(encoding="utf-8"))["reduction"]
    known = {name for _first, name in architectures()}
    for g in list_gpus():
        assert g.architecture in known, g.name
        for cuda, row in context.items():
            assert g.architecture in row, f"{g.name}: no {g.architecture} figure in cuda_context.json's {cuda} row"
            assert row[g.architecture] is None or row[g.architecture] > 0
        assert g.cc in kernels["threads_per_sm"], f"{g.name}: no threads_per_sm for {g.cc} in cuda_kernels.json"
    for cuda, row in context.items():  # a row names no architecture the catalogue does not know
        assert set(row) <= known, cuda
    assert set(context["cuda12"]) == known and all(v for v in context["cuda12"].values())  # CUDA 12 runs them all
