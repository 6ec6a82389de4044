"""The model directory (``REMOTE_AUTOGRAD_MODEL_DIR``): safetensors files a session may load by name.

A big model's weights are already on the server; a client names a file and the load
step reads its tensors there (``service/engine/load_step.py``), so nothing is uploaded. A name
comes from the wire, so it is a name and nothing more: a relative ``/``-separated path
inside the directory, ending ``.safetensors``, without ``.``/``..`` parts, and a file that,
links followed, is still inside the directory. Anything else is refused with a 400 that
says which rule it broke, before the file system is asked about it (beyond resolving the
name). Files are read with safetensors' own loader, which holds tensors only: nothing is
unpickled or run.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError, safe_open

from remote_autograd.proto import ErrorCode, ProtocolError, dtype_name

SUFFIX = ".safetensors"
_SETTING = "REMOTE_AUTOGRAD_MODEL_DIR"

# safetensors' dtype names for the dtypes the wire carries (proto/dtypes.py)
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "C64": torch.complex64}


def _refuse(name: str, rule: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_REQUEST, f"model name {name!r}: {rule}")


def resolve(model_dir: str, name: str) -> Path:
    """The file ``name`` names in ``model_dir``: a 400 naming the rule it breaks, 404 when it is not there."""
    if not name or name.startswith("/") or "\\" in name or "\0" in name or (len(name) > 1 and name[1] == ":"):
        raise _refuse(name, f"give a name relative to the model directory ({_SETTING}), '/'-separated, not a path")
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise _refuse(name, "no empty, '.' or '..' parts: names stay inside the model directory")
    if not name.endswith(SUFFIX) or parts[-1] == SUFFIX:
        raise _refuse(name, f"only {SUFFIX} files can be loaded")
    if not model_dir:
        raise ProtocolError(ErrorCode.UNKNOWN_MODEL,
                            f"no model {name!r}: this server has no model directory ({_SETTING} is not set)")
    root = Path(model_dir).resolve()
    path = (root / name).resolve()  # links followed: where the name really leads
    if not path.is_relative_to(root):
        raise _refuse(name, "it is a link that leads outside the model directory")
    if not path.is_file():
        raise ProtocolError(ErrorCode.UNKNOWN_MODEL, f"no model {name!r} in the model directory; GET /v1/models lists them")
    return path


def list_models(model_dir: str) -> list[dict]:
    """Every ``.safetensors`` file under ``model_dir`` that ``resolve`` would accept, by name (sorted)."""
    if not model_dir:
        return []
    root = Path(model_dir).resolve()
    found = []
    for folder, dirs, files in os.walk(root):  # directory links are not followed
        dirs.sort()
        for file in files:
            if not file.endswith(SUFFIX) or file == SUFFIX:
                continue
            path = Path(folder, file)
            if path.resolve().is_relative_to(root) and path.is_file():
                found.append({"name": path.relative_to(root).as_posix(), "bytes": path.stat().st_size})
    return sorted(found, key=lambda m: m["name"])


def describe(model_dir: str, name: str) -> dict:
    """``ModelInfo``: the file's tensors (key, dtype, shape) in the file's order, read from its header."""
    path = resolve(model_dir, name)
    with _open(path, name) as f:
        tensors = []
        for key in f.offset_keys():  # the order safetensors.torch.load_file gives
            piece = f.get_slice(key)
            kind = piece.get_dtype()
            wire = dtype_name(_DTYPES[kind]) if kind in _DTYPES else kind
            tensors.append({"key": key, "dtype": wire, "shape": list(piece.get_shape())})
    return {"name": name, "bytes": path.stat().st_size, "tensors": tensors}


def sizes(path: Path, name: str, keys: list[str]) -> list[tuple[int, int]]:
    """(elements, bytes) of each of ``keys`` in the file, from its header: nothing is read yet.
    A key the file lacks is 404; a dtype the wire has no name for is 422."""
    with _open(path, name) as f:
        present = set(f.keys())
        out = []
        for key in keys:
            if key not in present:
                raise ProtocolError(ErrorCode.UNKNOWN_TENSOR, f"model {name!r} has no tensor {key!r}")
            piece = f.get_slice(key)
            dtype = _DTYPES.get(piece.get_dtype())
            if dtype is None:
                raise ProtocolError(ErrorCode.OP_ERROR, f"model {name!r}: tensor {key!r} is {piece.get_dtype()}, "
                                                        "a dtype remote-autograd cannot hold")
            numel = 1
            for d in piece.get_shape():
                numel *= d
            out.append((numel, numel * dtype.itemsize))
    return out


def read(path: Path, name: str, keys: list[str], device: torch.device) -> list[torch.Tensor]:
    """The tensors of ``keys``, on ``device``, as safetensors reads them."""
    with _open(path, name, device) as f:
        return [f.get_tensor(key) for key in keys]


@contextlib.contextmanager
def _open(path: Path, name: str, device: torch.device | str = "cpu") -> Iterator:
    """``safe_open`` of the file; a file it cannot read (opening it or any tensor in it) is 422."""
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            yield f
    except (SafetensorError, OSError) as exc:
        raise ProtocolError(ErrorCode.OP_ERROR, f"model {name!r} is not a readable safetensors file: {exc}") from None
