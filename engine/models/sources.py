"""Model sources: what the user chose (a template name, a builder sketch, `file.py:function`) turned into
`(model, example inputs)` for a training configuration. Every mistake a user can make is a one-line UserError.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import itertools
import linecache
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..config.train_config import TrainConfig
from ..core.bounded_read import read_json
from ..core.errors import UserError
from ..sketch.document import Sketch
from .hf_source import HFConfigSource, hf_catalogue, looks_like_hf_config
from .source import ModelSource
from .templates import TEMPLATES, TemplateInfo

if TYPE_CHECKING:
    from ..sketch.document import Sketch


class TemplateSource(ModelSource):
    kind = "template"

    def __init__(self, info: TemplateInfo):
        self.info = info
        self.name = info.name

    def build(self, cfg: TrainConfig) -> tuple[nn.Module, Any]:
        return self.info.build(cfg.batch_size, cfg.seq_len, cfg.image_size)

    def describe(self) -> str:
        i = self.info
        size = f"sequence {i.default_seq_len}" if i.family == "text" else f"image {i.default_image_size}px"
        return f"{i.name}: {i.description} ({i.reference_parameters:,} parameters, default {size})"


class SketchSource(ModelSource):
    """A builder sketch (engine.sketch.document.Sketch), from memory (the GUI) or from a .json file."""

    kind = "sketch"

    def __init__(self, sketch: Sketch, path: Path | None = None):
        self.sketch = sketch
        self.path = path
        # An untitled sketch saved as mynet.json is "mynet" (in the report's title and the exported class).
        name = sketch.name if sketch.name not in ("", "untitled") else None
        self.name = name or (Path(path).stem if path else "sketch")

    @classmethod
    def from_path(cls, path: str | Path) -> SketchSource:
        p = Path(path)
        if not p.exists():
            raise UserError(f"sketch file '{p}' not found")
        return cls(Sketch.load(p), p)

    def build(self, cfg: TrainConfig) -> tuple[nn.Module, Any]:
        return self.sketch.to_module(), self.sketch.example_inputs(cfg.batch_size)

    def describe(self) -> str:
        return f"sketch '{self.name}'" + (f" from {self.path}" if self.path else "")


_module_ids = itertools.count()


def _keep_text(file: str, data: bytes) -> None:
    """`data` kept as the source of `file` for whatever reads it (inspect, tracebacks): linecache keeps an entry
    without a modification time as it is, never reading the disk for it again."""
    lines = importlib.util.decode_source(data).splitlines(keepends=True)
    linecache.cache[file] = (len(data), None, lines, file)


def _keep_texts(modules: list[ModuleType], folder: Path) -> None:
    """The text of each module just imported from the model file's folder (its neighbours), read now, kept as its
    source while it is loaded: Python does not import a module again, so the file edited afterwards is not what
    runs, and the fold's checks (which read a helper's loops where they run) must not read it as if it were."""
    for mod in modules:
        file = getattr(mod, "__file__", None)  # (a user's module: any object)
        if not isinstance(file, str) or not file.endswith(".py"):
            continue
        kept = linecache.cache.get(file)
        if kept is not None and len(kept) == 4 and kept[1] is None:  # (kept already: the text it was imported from)
            continue
        try:
            if not Path(file).resolve().is_relative_to(folder):
                continue
            _keep_text(file, Path(file).read_bytes())
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue  # (read as before: from the disk when asked)


def user_code_output() -> contextlib.AbstractContextManager[object]:
    """While user code runs (import, build, forward), what it prints goes to stderr: stdout carries only the
    command's own output (`--json` stays one JSON object)."""
    return contextlib.redirect_stdout(sys.stderr)


class FileSource(ModelSource):
    """`path/to/file.py:function` where `function(batch_size)` returns `(model, inputs)`.

    The file is imported once, here, outside any meta-device context, so its module-level code runs normally
    and a missing function is reported before any tracing.
    """

    kind = "file"

    def __init__(self, path: str | Path, function: str):
        self.path = Path(path)
        self.function = function
        self.name = f"{self.path.name}:{function}"
        if not function:
            raise UserError(f"'{path}:' names no function; give path/to/file.py:function")
        if not self.path.is_file():
            raise UserError(f"model file '{self.path}' not found")
        self._file = str(self.path.resolve())
        self.module = self._import()
        self.fn = self._lookup()

    def _import(self) -> ModuleType:
        name = f"vramscope_user_{next(_module_ids)}_{self.path.stem}"
        spec = importlib.util.spec_from_file_location(name, self._file)
        if spec is None or spec.loader is None:
            raise UserError(f"cannot import '{self.path}' as Python")
        module = importlib.util.module_from_spec(spec)
        # Registered so that user code relying on its own module (dataclasses, pickling of classes) works.
        sys.modules[name] = module
        try:
            code = self._code(spec.loader)
            with self._on_path(), user_code_output():
                exec(code, module.__dict__)  # noqa: S102  (what the loader's exec_module does, on the text read here)
        except UserError:
            raise
        except BaseException as e:  # noqa: BLE001 - any failure of user code becomes a one-line message
            sys.modules.pop(name, None)
            if isinstance(e, KeyboardInterrupt):
                raise
            raise self._user_code_error(e, f"importing {self.path.name}") from None
        return module

    def _code(self, loader: importlib.abc.Loader) -> CodeType:
        """The file's code, compiled from the text read once here, and that text kept as the file's source for
        whatever reads it while the model is loaded (the fold's checks read the model's loops, tracebacks its lines):
        the file edited on disk afterwards is not what runs, and is not read as if it were. (linecache keeps an entry
        without a modification time as it is.)"""
        data = Path(self._file).read_bytes()
        if not isinstance(loader, importlib.machinery.SourceFileLoader):
            raise UserError(f"cannot import '{self.path}' as Python")
        code = loader.source_to_code(data, self._file)
        _keep_text(self._file, data)
        return code

    def _lookup(self) -> Callable[[int], object]:
        fn: object = getattr(self.module, self.function, None)  # the user's module: its names are data
        if callable(fn):
            return fn
        own = sorted(
            n for n, v in vars(self.module).items()
            if not n.startswith("_") and inspect.isfunction(v) and v.__module__ == self.module.__name__
        )
        close = difflib.get_close_matches(self.function, own, n=3)
        if close:
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?"
        elif own:
            hint = f"; functions defined there: {', '.join(own[:8])}"
        else:
            hint = "; the file defines no functions"
        what = "is not a function" if fn is not None else "not found"
        raise UserError(f"function '{self.function}' {what} in '{self.path}'{hint}")

    @contextlib.contextmanager
    def _on_path(self) -> Iterator[None]:
        # The user's file may import its neighbours.
        folder = str(Path(self._file).parent)
        added = folder not in sys.path
        if added:
            sys.path.insert(0, folder)
        before = set(sys.modules)
        try:
            yield
        finally:
            if added and folder in sys.path:
                sys.path.remove(folder)
            _keep_texts([m for n in set(sys.modules) - before if (m := sys.modules.get(n)) is not None], Path(folder))

    def build(self, cfg: TrainConfig) -> tuple[nn.Module, Any]:
        try:
            with self._on_path(), user_code_output():
                result = self.fn(cfg.batch_size)
        except UserError:
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure of user code becomes a one-line message
            raise self._user_code_error(e, f"{self.function}({cfg.batch_size})") from None
        return self._check(result)

    def _check(self, result: object) -> tuple[nn.Module, Any]:
        where = f"{self.name} must return (model, inputs)"
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            got = f"a {len(result)}-item {type(result).__name__}" if isinstance(result, (tuple, list)) else \
                type(result).__name__
            raise UserError(f"{where}; it returned {got}")
        model, inputs = result
        if not isinstance(model, nn.Module):
            raise UserError(f"{where} with model an nn.Module; got {type(model).__name__}")
        if not isinstance(inputs, (torch.Tensor, tuple, list, dict)):
            raise UserError(f"{where} with inputs a tensor, a tuple or a dict; got {type(inputs).__name__}")
        if isinstance(inputs, list):
            inputs = tuple(inputs)
        return model, inputs

    def _user_code_error(self, e: BaseException, doing: str) -> UserError:
        """The user's file:line (deepest frame in their file) and the exception, on one line."""
        line = None
        if isinstance(e, SyntaxError) and e.filename and Path(e.filename).resolve() == Path(self._file):
            line = e.lineno
        else:
            for frame, lineno in traceback.walk_tb(e.__traceback__):
                if frame.f_code.co_filename == self._file:
                    line = lineno
        where = f"{self.path}:{line}" if line else str(self.path)
        if isinstance(e, SystemExit):  # a script's exit is not a result: never a silent status 0 (or 3)
            return UserError(f"{where}: the model's code called sys.exit({e.code!r}) (while {doing}); "
                             "a model file must return (model, inputs), not exit")
        msg = " ".join(str(e).split()) or "(no message)"
        if isinstance(e, SyntaxError):
            msg = " ".join((e.msg or "invalid syntax").split())
        return UserError(f"{where}: {type(e).__name__}: {msg} (while {doing})")

    def describe(self) -> str:
        return f"{self.function}() from {self.path}"


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


_BY_KEY = {_key(n): info for n, info in TEMPLATES.items()}


@dataclass(frozen=True)
class CatalogueItem:
    """A model the app lists by name: a built-in template or a shipped Hugging Face configuration."""

    name: str
    description: str
    family: str  # "vision" | "text" | "speech"
    kind: str  # "template" | "hf-config"


def model_catalogue() -> list[CatalogueItem]:
    """Every model reachable by name, templates first: what `estimate NAME` and the app's template list take."""
    items = [CatalogueItem(n, t.description, t.family, "template") for n, t in TEMPLATES.items()]
    for name, e in hf_catalogue().items():
        family = "vision" if "vit" in name else "speech" if "whisper" in name else "text"
        items.append(CatalogueItem(name, f"{e.description}; Hugging Face {e.hf_id} config", family, "hf-config"))
    return items


def _catalogue_names() -> list[str]:
    return list(TEMPLATES) + list(hf_catalogue())


def _json_source(ref: str) -> ModelSource:
    """A .json file: a Hugging Face config (it has a model_type) or a builder sketch."""
    p = Path(ref)
    if p.is_file() and p.name != "config.json":
        # bounded (size, depth, numbers): one line for a file that is neither, never a RecursionError
        data = read_json(p, what="sketch or Hugging Face config")
        if not looks_like_hf_config(data):
            return SketchSource.from_path(ref)
    elif not p.is_file() and p.name != "config.json":
        return SketchSource.from_path(ref)
    return HFConfigSource.from_path(p)


def resolve_source(ref: str) -> ModelSource:
    """A template or catalogue name (any case, '-' or '_'), a sketch `.json`, a Hugging Face `config.json` (or a
    folder holding one), or `path/to/file.py:function`."""
    ref = (ref or "").strip()
    if not ref:
        raise UserError("no model given: name a template, a sketch .json, a Hugging Face config.json or "
                        "path/to/file.py:function")
    path_part, sep, func = ref.rpartition(":")
    if sep and path_part.lower().endswith(".py"):
        return FileSource(path_part, func.strip())
    if ref.lower().endswith(".py"):
        raise UserError(f"'{ref}' names no function; give {ref}:function, where function(batch_size) "
                        "returns (model, inputs)")
    if ref.lower().endswith(".json"):
        return _json_source(ref)
    info = _BY_KEY.get(_key(ref))
    if info is not None:
        return TemplateSource(info)
    entry = next((e for n, e in hf_catalogue().items() if _key(n) == _key(ref)), None)
    if entry is not None:
        return HFConfigSource.from_catalogue(entry)
    if Path(ref).is_dir():
        return HFConfigSource.from_path(ref)
    if "/" in ref or "\\" in ref or Path(ref).exists():
        raise UserError(f"'{ref}' is neither a model name, a sketch .json, a Hugging Face config nor "
                        "path/to/file.py:function")
    names = _catalogue_names()
    close = difflib.get_close_matches(ref.lower(), names, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise UserError(f"unknown template '{ref}'{hint}; names: {', '.join(names)}; "
                    "or give a sketch .json, a Hugging Face config.json or path/to/file.py:function")
