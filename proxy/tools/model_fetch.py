"""Fetch the `local` ranker's model once into its directory, never on the request path.

The published int8 ONNX exports of all-MiniLM-L6-v2 live beside its tokenizer in the model's
hub repository; the CPU decides the variant (the x86 build uses AVX2 kernels, ARM its own).
Files land under a temporary name, are checked (not an HTML page, the expected sha256) and only
then renamed into place, so a half-written or wrong model is never loaded; a directory that
already holds both files is left alone. Every failure is a `ModelFetchError` naming the URL.
"""

from __future__ import annotations

import hashlib
import os
import platform
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

FILES = ("model.onnx", "tokenizer.json")

# sha256 of each published file, by its path in the model's repository; None: not checked.
DIGESTS: Mapping[str, str | None] = {
    # The published tokenizer.json, as copied into ../shared/data/models/all-MiniLM-L6-v2-int8.
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    # Not verifiable here: the only model.onnx at hand (../shared/data/models/all-MiniLM-L6-v2-int8)
    # is a local int8 export (see its SOURCES.md), not either published variant, so its digest says
    # nothing about them. The digest check is skipped for these two files only.
    "onnx/model_quint8_avx2.onnx": None,
    "onnx/model_qint8_arm64.onnx": None,
}

# (file name, bytes so far, total bytes or None when the server does not say)
Progress = Callable[[str, int, int | None], None]


class ModelFetchError(Exception):
    """A model file could not be fetched or is not the expected file; the message names its URL."""


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


def fetch_model(directory: str | Path, source: str, timeout: float = 120.0, *, verify: bool = True,
                digests: Mapping[str, str | None] = DIGESTS, progress: Progress | None = None) -> Path:
    """Download model.onnx and tokenizer.json into `directory` unless they are there already.

    With `verify`, a file whose path has a digest in `digests` must match it, whatever the source.
    """
    target = Path(directory)
    remote = {"model.onnx": f"onnx/{onnx_variant()}", "tokenizer.json": "tokenizer.json"}
    with httpx.Client(timeout=timeout, follow_redirects=True) as client:
        for name in FILES:
            path = target / name
            if path.is_file():
                continue
            url = f"{source.rstrip('/')}/{remote[name]}"
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ModelFetchError(f"{url}: cannot create {target}: {exc}") from exc
            expected = digests.get(remote[name]) if verify else None
            _fetch_file(client, url, path, expected, progress)
    return target


def _fetch_file(client: httpx.Client, url: str, path: Path, expected: str | None, progress: Progress | None) -> None:
    partial: str | None = None
    try:
        handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        sha = hashlib.sha256()
        # identity: the progress total is the file's size, not a compressed one
        with os.fdopen(handle, "wb") as out, client.stream("GET", url, headers={"accept-encoding": "identity"}) as response:
            if response.status_code != 200:
                raise ModelFetchError(f"{url}: HTTP {response.status_code} {response.reason_phrase}")
            if response.headers.get("content-type", "").lower().startswith("text/html"):
                raise ModelFetchError(f"{url}: got an HTML page, not the model file (is the source the base URL "
                                      "of the files themselves, like …/resolve/main?)")
            length = response.headers.get("content-length", "")
            total = int(length) if length.isdigit() else None
            report = _Reporter(path.name, total, progress)
            done = 0
            for chunk in response.iter_bytes(1 << 20):
                if done == 0 and chunk.lstrip()[:1] == b"<":
                    raise ModelFetchError(f"{url}: the body is markup (it starts with '<'), not the model file")
                out.write(chunk)
                sha.update(chunk)
                done += len(chunk)
                report(done)
            if done == 0:
                raise ModelFetchError(f"{url}: the body is empty")
            report(done, final=True)
        if expected is not None and sha.hexdigest() != expected:
            raise ModelFetchError(f"{url}: sha256 {sha.hexdigest()} is not the expected {expected} "
                                  "(`keel fetch-model --no-verify` accepts another build)")
        os.chmod(partial, 0o644)  # mkstemp's 0600 would hide the model from the user Keel runs as
        os.replace(partial, path)
    except httpx.HTTPError as exc:
        raise ModelFetchError(f"{url}: {type(exc).__name__}: {exc}") from exc
    except OSError as exc:
        raise ModelFetchError(f"{url}: cannot write {path}: {exc}") from exc
    finally:
        if partial is not None and os.path.exists(partial):
            os.unlink(partial)


class _Reporter:
    """Calls `progress` when a file passes each further tenth of its size (every 8 MiB when the
    size is unknown) and once at its end, so a large file reports about ten times, never per chunk."""

    def __init__(self, name: str, total: int | None, progress: Progress | None) -> None:
        self.name, self.total, self.progress = name, total, progress
        self.step = max(1, total // 10) if total else 8 << 20
        self.next = self.step
        self.reported = -1

    def __call__(self, done: int, final: bool = False) -> None:
        if self.progress is not None and (done >= self.next or (final and done != self.reported)):
            self.progress(self.name, done, self.total)
            self.reported = done
            self.next = (done // self.step + 1) * self.step
