"""GPU calibration profiles: what one GPU's kernels, libraries and context were measured to take.

A profile is learned from per-op measurements (the records `vramscope calibrate` takes on a CUDA machine, or
`../shared/gpu/record_ops.py` writes): for every op, the memory allocated before and after it and the peak inside
it. From those it keeps, per distinct kernel call (op, input shapes and dtypes, output bytes), the scratch the
kernel allocated and freed before returning (cuDNN convolution and attention workspaces, RNN workspaces), the
cuBLAS workspaces each GEMM thread keeps, and the CUDA context. Built-in profiles live in
resources/gpu_profiles/ (learned from the project's own measurements); user profiles in the user's data folder.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import statistics
import sys
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..config.gpus import find_gpu
from ..core.atomic_write import replace_atomically
from ..core.bounded_read import open_regular, parse_json, read_json
from ..core.errors import UserError, printable
from ..core.failure_text import failure_detail
from ..core.resources import resource_path

PROFILE_VERSION = 1
MAX_PROFILE_BYTES = 32 << 20  # the largest built-in profile is well under 1 MiB
# ops whose kernels allocate scratch that a fake tensor cannot know
KERNEL_OPS = frozenset({
    "convolution.default",
    "convolution_backward.default",
    "_cudnn_rnn.default",
    "_cudnn_rnn_backward.default",
    "_scaled_dot_product_cudnn_attention.default",
    "_scaled_dot_product_cudnn_attention_backward.default",
    "_scaled_dot_product_flash_attention.default",
    "_scaled_dot_product_flash_attention_backward.default",
    "_scaled_dot_product_efficient_attention.default",
    "_scaled_dot_product_efficient_attention_backward.default",
    "_transformer_encoder_layer_fwd.default",
})
GEMM_OPS = frozenset({"mm.default", "addmm.default", "bmm.default", "baddbmm.default", "linear.default"})
CUBLAS_MIN = 1 << 20  # a GEMM that keeps at least this much beyond its output has just made a cuBLAS workspace
OUTPUT = 0  # in KernelRecord.requests: the op's next output (any other entry is the bytes of a scratch request)


Signature = tuple[tuple[tuple[int, ...], str], ...]  # ((shape, dtype), ...)


@dataclass(frozen=True)
class KernelRecord:
    """One distinct kernel call: scratch bytes (the largest measured: an upper figure) and the smallest.

    `requests`, when the allocator's own trace was recorded with it: every allocation the call made, in order —
    OUTPUT for each storage it returned, else the bytes of a scratch request it freed before returning (a cuDNN
    convolution backward: grad_input, its workspace, grad_weight, its workspace). Empty when only the op's peak
    was measured: the scratch is then one request after the outputs."""

    op: str
    inputs: Signature
    out: int
    scratch: int
    scratch_min: int
    count: int
    requests: tuple[int, ...] = ()

    @property
    def key(self) -> tuple[str, Signature, int]:
        return (self.op, self.inputs, self.out)


@dataclass(frozen=True)
class GpuProfile:
    gpu_name: str
    compute_capability: tuple[int, int]
    cuda: str | None  # CUDA version of the torch build that measured
    cudnn: int | None  # cudnn version number (91900 = 9.19)
    torch: str | None
    context_bytes: int | None  # NVML used − reserved after a training step (libraries loaded), measured
    cublas_workspaces: tuple[int, ...]  # bytes kept at the first GEMM of each thread: forward, then autograd
    kernels: tuple[KernelRecord, ...]
    source: str  # how it was made (a sentence)
    cases: tuple[str, ...] = ()  # the models whose steps were measured
    context_inference_bytes: int | None = None  # the same after an inference pass (one GEMM thread, fewer libraries)
    path: str | None = field(default=None, compare=False)  # where it was loaded from

    @property
    def cuda_major(self) -> int | None:
        try:
            return int(str(self.cuda).split(".")[0]) if self.cuda else None
        except ValueError:
            return None

    @property
    def cudnn_major(self) -> int | None:
        if not self.cudnn:
            return None
        return self.cudnn // 10000 if self.cudnn >= 90000 else self.cudnn // 1000  # 91900 = 9.19, 8907 = 8.9

    def table(self) -> dict[tuple[str, Signature, int], KernelRecord]:
        return _table(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": PROFILE_VERSION,
            "kind": "vramscope-gpu-profile",
            "gpu": {"name": self.gpu_name, "compute_capability": list(self.compute_capability)},
            "software": {"cuda": self.cuda, "cudnn": self.cudnn, "torch": self.torch},
            "context_bytes": self.context_bytes,
            "context_inference_bytes": self.context_inference_bytes,
            "cublas_workspaces": list(self.cublas_workspaces),
            "source": self.source,
            "cases": list(self.cases),
            "kernels": [
                {"op": k.op, "in": [[list(s), d] for s, d in k.inputs], "out": k.out, "scratch": k.scratch,
                 "scratch_min": k.scratch_min, "count": k.count,
                 **({"requests": list(k.requests)} if k.requests else {})}
                for k in self.kernels
            ],
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "profile") -> GpuProfile:
        try:
            if not isinstance(d, dict) or d.get("kind") != "vramscope-gpu-profile":
                raise UserError("not a VRAMScope GPU profile (no \"kind\": \"vramscope-gpu-profile\")", where=where)
            if int(d.get("version", 0)) > PROFILE_VERSION:
                raise UserError(f"profile version {d['version']} is newer than this VRAMScope reads "
                                f"({PROFILE_VERSION}); update VRAMScope", where=where)
            gpu, sw = d["gpu"], d.get("software", {})
            for key, value in (("gpu", gpu), ("software", sw)):
                if not isinstance(value, dict):
                    raise UserError(f'"{key}" is {type(value).__name__}, not an object; re-export the profile',
                                    where=where)
            name = gpu["name"]
            if not isinstance(name, str) or not name.strip() or not name.isprintable() or len(name) > 200:
                raise UserError(f"the GPU name {printable(name, 40)!r} is not one line of at most 200 characters",
                                where=where)
            cc = tuple(int(x) for x in gpu["compute_capability"])
            kernels = tuple(
                KernelRecord(op=str(k["op"]), inputs=_sig(k["in"]), out=_size(k["out"]), scratch=_size(k["scratch"]),
                             scratch_min=_size(k.get("scratch_min", k["scratch"])), count=int(k.get("count", 1)),
                             requests=_requests(k.get("requests", ())))
                for k in d.get("kernels", ())
            )
            return cls(
                gpu_name=name,
                compute_capability=(cc[0], cc[1]),
                cuda=_text(sw.get("cuda")),
                cudnn=int(sw["cudnn"]) if sw.get("cudnn") else None,
                torch=_text(sw.get("torch")),
                context_bytes=_size(d["context_bytes"]) if d.get("context_bytes") else None,
                cublas_workspaces=tuple(_size(x) for x in d.get("cublas_workspaces", ())),
                kernels=kernels,
                source=str(d.get("source", "")),
                cases=tuple(str(c) for c in d.get("cases", ())),
                context_inference_bytes=(_size(d["context_inference_bytes"]) if d.get("context_inference_bytes")
                                         else None),
            )
        except UserError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as e:
            raise UserError(f"broken GPU profile: {failure_detail(e)}; re-export it", where=where) from None


@lru_cache(maxsize=16)
def _table(p: GpuProfile) -> dict[tuple[str, Signature, int], KernelRecord]:
    return {k.key: k for k in p.kernels}


def _size(v: Any) -> int:
    """A measured size in bytes: a whole number from 0 to 2**62 (ValueError otherwise)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or not 0 <= v <= 2**62 or v != int(v):
        raise ValueError(f"{printable(v, 30)} is not a size in bytes (a whole number from 0 to 2**62)")
    return int(v)


def _text(v: Any) -> str | None:
    """A version string (CUDA's, torch's) as one printable line, or None."""
    if v is None:
        return None
    if not isinstance(v, (str, int, float)) or isinstance(v, bool):
        raise ValueError(f"a version that is {type(v).__name__}, not text")
    return printable(v, 40)


def _requests(items: Iterable[Any]) -> tuple[int, ...]:
    out = tuple(int(n) for n in items)
    if any(n < 0 for n in out):
        raise ValueError(f"a kernel request of negative bytes: {list(out)}")
    return out


def _sig(items: Iterable[Any]) -> Signature:
    return tuple((tuple(int(x) for x in shape), str(dtype)) for shape, dtype in items)


def short_op(op: str) -> str:
    """'aten.convolution.default' → 'convolution.default' (the tracer's name for it)."""
    return op[5:] if op.startswith("aten.") else op


# ------------------------------------------------------------------------------------------------ learning


def read_ops(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a record_ops / calibrate run: head lines ({"case", …}) and op lines, in order."""
    p = Path(path)
    fd, _size = open_regular(p, where=f"--from-ops: {p}", what="file of op records")  # never a FIFO or device
    rows: list[dict[str, Any]] = []
    try:
        with open(fd, "rb") as raw:
            f = io.TextIOWrapper(gzip.GzipFile(fileobj=raw) if p.suffix == ".gz" else raw, encoding="utf-8")
            for n, line in enumerate(f, 1):
                if line.strip():
                    rows.append(_op_row(parse_json(line, f"--from-ops: {p} line {n}"), p, n))
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
        raise UserError(f"cannot read {p} as op records ({printable(e, 80)})", where="--from-ops") from None
    return rows


_OP_FIELDS = ("before", "after", "peak", "out")


def _op_row(r: Any, p: Path, n: int) -> dict[str, Any]:
    """An op record checked for what learning reads of it (a head line {"case", …} is kept as it is)."""
    where = f"{p} line {n}"
    if not isinstance(r, dict):
        raise UserError(f"{where}: a record is a JSON object, not {type(r).__name__}", where="--from-ops")
    if "case" in r:
        return r
    missing = [k for k in ("op", "in", *_OP_FIELDS) if k not in r]
    if missing:
        raise UserError(f"{where}: the record has no {', '.join(missing)}; is this a record_ops file?",
                        where="--from-ops")
    bad = [k for k in _OP_FIELDS if isinstance(r[k], bool) or not isinstance(r[k], int) or not 0 <= r[k] <= 2**62]
    if bad or not isinstance(r["op"], str) or not isinstance(r["in"], list):
        raise UserError(f"{where}: {', '.join(bad) or 'op/in'} is not what record_ops writes (bytes as whole "
                        "numbers, op a name, in a list)", where="--from-ops")
    return r


def kernel_scratch(row: dict[str, Any]) -> int:
    """Bytes an op allocated and freed before it returned: peak inside it − the larger of before and after."""
    return max(0, int(row["peak"]) - max(int(row["before"]), int(row["after"])))


def profile_from_ops(
    rows: list[dict[str, Any]],
    *,
    gpu_name: str | None = None,
    compute_capability: tuple[int, int] | None = None,
    context_bytes: int | None = None,
    context_inference_bytes: int | None = None,
    source: str = "",
) -> GpuProfile:
    """Learn a profile from op records (see read_ops): each distinct kernel call's scratch, the cuBLAS workspaces."""
    acc: dict[tuple[str, Signature, int], list[int]] = {}
    seqs: dict[tuple[str, Signature, int], list[tuple[int, ...]]] = {}
    cublas: dict[int, list[int]] = {}  # thread (0 forward, 1 autograd) -> what its first GEMM kept, per case
    heads = [r for r in rows if "case" in r and "error" not in r]
    cases = tuple(f"{h['case']} {json.dumps(h.get('config', {}), sort_keys=True)}" for h in heads)
    first_gemms_seen = 0
    for r in rows:
        if "case" in r:
            first_gemms_seen = 0
            continue
        op = short_op(r["op"])
        if op in KERNEL_OPS:
            key = (op, _sig(r["in"]), int(r["out"]))
            acc.setdefault(key, []).append(kernel_scratch(r))
            if r.get("requests"):
                seqs.setdefault(key, []).append(_requests(r["requests"]))
        elif op in GEMM_OPS and first_gemms_seen < 2:
            kept = int(r["after"]) - int(r["before"]) - int(r["out"])
            if kept >= CUBLAS_MIN:
                first_gemms_seen += 1
                cublas.setdefault(first_gemms_seen - 1, []).append(kept)
    kernels = tuple(
        KernelRecord(op=k[0], inputs=k[1], out=k[2], scratch=max(v), scratch_min=min(v), count=len(v),
                     requests=usual_requests(seqs.get(k, [])))
        for k, v in sorted(acc.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), kv[0][2]))
    )
    head = heads[0] if heads else {}
    name = gpu_name or head.get("gpu") or "unknown GPU"
    torch_v = head.get("torch")
    cuda = None
    m = re.search(r"\+cu(\d+)", str(torch_v or ""))
    if m:
        digits = m.group(1)
        cuda = f"{digits[:-1]}.{digits[-1]}"
    if compute_capability is None:
        compute_capability = find_gpu(name).compute_capability
    return GpuProfile(
        gpu_name=name,
        compute_capability=compute_capability,
        cuda=cuda,
        cudnn=int(head["cudnn"]) if head.get("cudnn") else None,
        torch=torch_v,
        context_bytes=context_bytes,
        # the median over the cases: an output's rounding can add or take a few KiB in one case
        cublas_workspaces=tuple(statistics.median_low(cublas[t]) for t in sorted(cublas)),
        kernels=kernels,
        source=source,
        cases=cases,
        context_inference_bytes=context_inference_bytes,
    )


def usual_requests(seqs: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The request sequence a kernel call made most often (cuDNN may pick another plan when memory is short);
    among equally frequent ones the largest. Empty when none was recorded."""
    if not seqs:
        return ()
    counts: dict[tuple[int, ...], int] = {}
    for s in seqs:
        counts[s] = counts.get(s, 0) + 1
    return max(counts, key=lambda s: (counts[s], sum(s)))


# ------------------------------------------------------------------------------------------------ storage


def user_data_dir() -> Path:
    """The user's data folder for VRAMScope (VRAMSCOPE_DATA_DIR overrides it)."""
    env = os.environ.get("VRAMSCOPE_DATA_DIR")
    if env:
        return Path(env)
    home = Path.home()
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local") / "VRAMScope"
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "VRAMScope"
    return Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share") / "vramscope"


def profiles_dir() -> Path:
    return user_data_dir() / "gpu_profiles"


def builtin_dir() -> Path:
    return resource_path("gpu_profiles")


def profile_filename(p: GpuProfile) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", p.gpu_name.lower()).strip("-")[:100].strip("-")
    return f"{slug or 'gpu'}.json"


def load_profile(path: str | os.PathLike[str]) -> GpuProfile:
    p = Path(path)
    # a regular file of a profile's size (a FIFO, /dev/zero, a binary or 100k-deep file: one line)
    data = read_json(p, max_bytes=MAX_PROFILE_BYTES, what="GPU profile")
    prof = GpuProfile.from_json(data, where=str(p))
    return replace(prof, path=str(p))


def save_profile(p: GpuProfile, path: str | os.PathLike[str] | None = None) -> Path:
    """Write `p` (to the user's profile folder by default, one file per GPU model). Returns where."""
    target = Path(path) if path is not None else profiles_dir() / profile_filename(p)
    where = "--output" if path is not None else "profile folder"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(target, json.dumps(p.to_json(), indent=1) + "\n")
    except FileExistsError:
        raise UserError(f"cannot write {target}: {target.parent} is a file, not a folder; move it away",
                        where=where) from None
    except OSError as e:  # permission, a full disk (/dev/full), a name too long
        raise UserError(f"cannot write {target}: {e.strerror or e}; choose another place", where=where) from None
    _user_dir.cache_clear()
    return target


def import_profile(path: str | os.PathLike[str]) -> Path:
    """Copy a profile made elsewhere into the user's folder (checked first). Returns where it went."""
    return save_profile(load_profile(path))


def export_profile(gpu: str, path: str | os.PathLike[str]) -> Path:
    """Write the profile that estimates for `gpu` use to `path`."""
    prof = profile_for(gpu)
    if prof is None:
        raise UserError(f"no calibration profile for {gpu}; run `vramscope calibrate` on a machine with one",
                        where="--export")
    return save_profile(prof, path)


@lru_cache(maxsize=1)
def _user_dir() -> tuple[tuple[GpuProfile, ...], tuple[str, ...]]:
    return _load_dir(profiles_dir())


def _user_profiles() -> tuple[GpuProfile, ...]:
    return _user_dir()[0]


@lru_cache(maxsize=1)
def _builtin_profiles() -> tuple[GpuProfile, ...]:
    return _load_dir(builtin_dir())[0]


def _load_dir(d: Path) -> tuple[tuple[GpuProfile, ...], tuple[str, ...]]:
    """The profiles in folder `d`, and one line for each file skipped: a broken file costs only itself."""
    out, skipped = [], []
    if d.is_dir():
        for f in sorted(d.glob("*.json")):
            try:
                out.append(load_profile(f))
            except UserError as e:
                skipped.append(str(e))
    return tuple(out), tuple(skipped)


def skipped_profiles() -> tuple[str, ...]:
    """Why each unreadable file in the user's profile folder was skipped (one line each)."""
    return _user_dir()[1]


def list_profiles() -> list[tuple[str, GpuProfile]]:
    """("user" | "built-in", profile) for every profile found, user ones first."""
    return [("user", p) for p in _user_profiles()] + [("built-in", p) for p in _builtin_profiles()]


def profile_for(gpu_name: str | None) -> GpuProfile | None:
    """The profile for this catalogue GPU: the user's own calibration first, else a built-in one."""
    if not gpu_name:
        return None
    try:
        want = find_gpu(gpu_name).name
    except UserError:
        return None
    for _where, p in list_profiles():
        try:
            if find_gpu(p.gpu_name).name == want:
                return p
        except UserError:
            continue
    return None


def reload_profiles() -> None:
    _user_dir.cache_clear()
    _builtin_profiles.cache_clear()


def profile_summary(p: GpuProfile) -> str:
    sw = ", ".join(x for x in (f"CUDA {p.cuda}" if p.cuda else "", f"cuDNN {p.cudnn}" if p.cudnn else "",
                               f"torch {p.torch}" if p.torch else "") if x)
    ctx = f"context {p.context_bytes / 2**20:,.0f} MiB" if p.context_bytes else "context not measured"
    cc = f"sm{p.compute_capability[0]}{p.compute_capability[1]}"
    return f"{p.gpu_name} ({cc}; {sw}): {len(p.kernels)} kernel shapes, {ctx}"


__all__ = [
    "GpuProfile", "KernelRecord", "KERNEL_OPS", "profile_from_ops", "read_ops", "load_profile", "save_profile",
    "import_profile", "export_profile", "profile_for", "list_profiles", "user_data_dir", "kernel_scratch",
]
