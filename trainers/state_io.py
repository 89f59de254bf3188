"""Checkpoint state without pickle: tensors into safetensors, everything else into JSON.

A training checkpoint holds nested state (model weights, the optimiser's ``state_dict``,
RNG states, a predictor's ``state_dict``, visit histories, the config). Loading a pickle
runs whatever code its author put in it, and a checksum file written by the same author
proves nothing, so a checkpoint someone else made must not be a pickle. `save_state`
splits such a tree into ``STEM.safetensors`` (every tensor and numpy array, by a
generated key) and ``STEM.json`` (the rest, with tensors replaced by their keys);
`load_state` puts it back. Only data comes back: dicts, lists, tuples, strings,
numbers, bytes, tensors, numpy arrays and the few dataclasses named in `_DATACLASSES`.

Checkpoints written before this format (``trainer.pt``, ``state.pkl``, TRL's
``trace_runner.pkl``) are pickles; `legacy_refused` is the error that says so, and
`load_legacy` reads one only when the user passed ``--trust-checkpoint``.
``torch.distributed.checkpoint`` keeps its ``.metadata`` as a pickle too;
`check_dcp_metadata` reads it with an unpickler that builds only DCP's metadata
classes and torch sizes/dtypes before DCP's own ``pickle.load`` sees it.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from trace_gym.alloc.base import VisitHistory
from trace_gym.errors import ConfigError
from trace_gym.optional import require

torch = require("torch", "train")

__all__ = [
    "FORMAT",
    "check_dcp_metadata",
    "decode",
    "encode",
    "legacy_refused",
    "load_legacy",
    "load_state",
    "save_state",
    "state_files",
]

#: the version written into every ``STEM.json``
FORMAT = "trace-gym-state/1"

#: the dataclasses a state may hold (rebuilt by name; nothing else is ever imported)
_DATACLASSES: dict[str, type] = {"VisitHistory": VisitHistory}


def state_files(stem: str) -> tuple[str, str]:
    """The two files `save_state` writes for `stem`."""
    return f"{stem}.safetensors", f"{stem}.json"


# ---------------------------------------------------------------------- encode / decode
def encode(obj: Any, tensors: dict[str, Any]) -> Any:
    """`obj` as JSON-able data; its tensors and arrays go into `tensors` under fresh keys."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else {"__float__": repr(v)}
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError("a numpy array of Python objects cannot be saved without pickle")
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).copy())
        return {"__ndarray__": key}
    if isinstance(obj, bytes):
        return {"__bytes__": base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return {"__tuple__": [encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [encode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode(v, tensors) for k, v in obj.items()}
        return {"__items__": [[encode(k, tensors), encode(v, tensors)] for k, v in obj.items()]}
    name = type(obj).__name__
    if dataclasses.is_dataclass(obj) and _DATACLASSES.get(name) is type(obj):
        fields = {f.name: encode(getattr(obj, f.name), tensors) for f in dataclasses.fields(obj)}
        return {"__dataclass__": name, "fields": fields}
    raise TypeError(f"a {type(obj).__module__}.{name} cannot be saved without pickle")


def _decode_tagged(obj: dict[str, Any], tensors: dict[str, Any]) -> Any:
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__ndarray__" in obj:
        return tensors[obj["__ndarray__"]].numpy()
    if "__float__" in obj:
        return float(obj["__float__"])
    if "__bytes__" in obj:
        return base64.b64decode(obj["__bytes__"])
    if "__tuple__" in obj:
        return tuple(decode(v, tensors) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in obj["__items__"]}
    if "__dataclass__" in obj:
        cls = _DATACLASSES.get(obj["__dataclass__"])
        if cls is None:
            raise ValueError(f"unknown dataclass {obj['__dataclass__']!r} in a saved state")
        return cls(**{k: decode(v, tensors) for k, v in obj["fields"].items()})
    raise ValueError(f"unknown tag in a saved state: {sorted(obj)[:3]}")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def decode(obj: Any, tensors: dict[str, Any]) -> Any:
    """The inverse of `encode`."""
    if isinstance(obj, list):
        return [decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if any(k.startswith("__") for k in obj):
        return _decode_tagged(obj, tensors)
    return {k: decode(v, tensors) for k, v in obj.items()}


# ---------------------------------------------------------------------- files
def save_state(folder: Path, stem: str, obj: Any) -> list[str]:
    """Write `obj` as ``STEM.safetensors`` + ``STEM.json`` in `folder`; the file names."""
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    data = encode(obj, tensors)
    st_name, json_name = state_files(stem)
    save_file(tensors, str(folder / st_name))
    (folder / json_name).write_text(json.dumps({"format": FORMAT, "data": data}) + "\n")
    return [st_name, json_name]


def load_state(folder: Path, stem: str) -> Any:
    """Read what `save_state` wrote (no code runs: safetensors and JSON only)."""
    from safetensors.torch import load_file

    st_name, json_name = state_files(stem)
    doc = json.loads((folder / json_name).read_text())
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{json_name} is not a {FORMAT} file")
    return decode(doc["data"], load_file(str(folder / st_name)))


# ---------------------------------------------------------------------- pickles of old runs
def legacy_refused(path: Path, names: list[str]) -> ConfigError:
    """The error for a checkpoint holding pickles (the old format), saying why and how to go on."""
    return ConfigError(
        f"checkpoint {path} holds pickles ({', '.join(names)}; the format before "
        "safetensors + JSON): loading them runs any code their author put in them, and its "
        "checksums.json proves nothing about who that was; resume from it only if you made "
        "it, with --trust-checkpoint (trust_checkpoint = true), or start over with --overwrite"
    )


def load_legacy(path: Path, trusted: bool) -> Any:
    """Unpickle the old-format file `path` (``torch.load`` or ``pickle``), only when `trusted`."""
    if not trusted:
        raise legacy_refused(path.parent, [path.name])
    if path.suffix == ".pt":
        return torch.load(path, map_location="cpu", weights_only=False)
    with open(path, "rb") as f:
        return pickle.load(f)


#: what a DCP ``.metadata`` pickle may build: module -> names (no dotted names, so no
#: attribute of an allowed module leads anywhere else)
_DCP_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "ChunkStorageMetadata",
            "BytesStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}


class _DcpUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_ALLOWED.get(module, ()) or _is_dtype(module, name):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not DCP metadata")


def _is_dtype(module: str, name: str) -> bool:
    return (
        module == "torch"
        and "." not in name
        and isinstance(getattr(torch, name, None), torch.dtype)
    )


def check_dcp_metadata(path: Path) -> None:
    """Raise `pickle.UnpicklingError` unless the DCP ``.metadata`` file `path` builds only
    DCP's metadata classes, torch sizes and dtypes (what DCP itself writes)."""
    _DcpUnpickler(io.BytesIO(path.read_bytes())).load()
