"""Fetch the `local` ranker's model once into its directory, never on the request path.

The published int8 ONNX exports of all-MiniLM-L6-v2 live beside its tokenizer in the model's
hub repository; the CPU decides the variant (the x86 build uses AVX2 kernels, ARM its own).
Files land under a temporary name and are renamed into place, so a half-written model is
never loaded, and a directory that already holds both files is left alone.
"""

from __future__ import annotations

import os
import platform
import tempfile
from pathlib import Path

import httpx

FILES = ("model.onnx", "tokenizer.json")


def onnx_variant(machine: str | None = None) -> str:
    """The published int8 export that runs on this CPU."""
    machine = (machine or platform.machine()).lower()
    return "model_qint8_arm64.onnx" if machine in ("arm64", "aarch64") else "model_quint8_avx2.onnx"


def default_model_dir() -> Path:
    """keel/all-MiniLM-L6-v2 under the user's cache directory ($XDG_CACHE_HOME or ~/.cache)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "keel" / "all-MiniLM-L6-v2"


def model_present(directory: str | Path) -> bool:
    return all((Path(directory) / name).is_file() for name in FILES)


def fetch_model(directory: str | Path, source: str, timeout: float = 120.0) -> Path:
    """Download model.onnx and tokenizer.json into `directory` unless they are there already."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    remote = {"model.onnx": f"onnx/{onnx_variant()}", "tokenizer.json": "tokenizer.json"}
    with httpx.Client(timeout=timeout, follow_redirects=True) as client:
        for name in FILES:
            path = target / name
            if path.is_file():
                continue
            url = f"{source.rstrip('/')}/{remote[name]}"
            handle, partial = tempfile.mkstemp(dir=target, prefix=f".{name}.")
            try:
                with os.fdopen(handle, "wb") as out, client.stream("GET", url) as response:
                    response.raise_for_status()
                    for chunk in response.iter_bytes(1 << 20):
                        out.write(chunk)
                os.replace(partial, path)
            finally:
                if os.path.exists(partial):
                    os.unlink(partial)
    return target
