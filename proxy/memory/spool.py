"""Memory asks the store would not take, kept in a local file until it does.

A memory ask the upstream accepted is never lost: when the store still refuses its job after
the intake's retries, the job goes to this process's spool, one JSON line in a file under
`store.spool_dir`, on disk (fsynced) before `add` returns, and is queued from there, in order,
once the store answers. Each process writes its own `<name>.spool` and holds an exclusive
lock on `<name>.lock` while it lives; a spool whose lock is free was left by a process that
stopped (the kernel frees the lock of one killed with SIGKILL too), and the next process to
look takes it over: its lines join that process's spool, in their order.

Without a directory (an in-memory store) the spool is kept in memory only.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, TypeVar

from proxy.memory.jobs import MemoryJob

log = logging.getLogger("keel.memory")
T = TypeVar("T")


class MemorySpool:
    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._jobs: list[MemoryJob] = []  # in order, as in the file
        self._held: Counter[str] = Counter()  # jobs waiting here, per user queue
        self._lock: IO[bytes] | None = None  # held while this process lives
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keel-spool")  # file work in order
        self._order = asyncio.Lock()  # the file and `_jobs` change together, in one order

    def __len__(self) -> int:
        return len(self._jobs)

    def holds(self, queue: str) -> bool:
        """Does a job of this user queue wait here? (Then a later one must wait behind it.)"""
        return self._held[queue] > 0

    def jobs(self) -> list[MemoryJob]:
        return list(self._jobs)

    async def add(self, job: MemoryJob) -> None:
        """Keep a job behind every job kept before it; on disk when this returns (OSError: not kept)."""
        async with self._order:
            self._keep([job])
            if self.directory is None:
                return
            try:
                await self._io(self._append, [job.to_bytes()])
            except BaseException:
                self._jobs.remove(job)
                self._held[job.queue] -= 1
                raise

    async def done(self, count: int) -> None:
        """The first `count` jobs are queued in the store now: forget them."""
        async with self._order:
            for job in self._jobs[:count]:
                self._held[job.queue] -= 1
            del self._jobs[:count]
            if self.directory is not None:
                await self._io(self._rewrite, [job.to_bytes() for job in self._jobs])

    async def adopt(self) -> int:
        """Take over the spools of stopped processes; how many jobs joined this one."""
        if self.directory is None or not self.directory.is_dir():
            return 0
        async with self._order:
            lines = await self._io(self._adopt)
            jobs = []
            for line in lines:
                try:
                    jobs.append(MemoryJob.from_bytes(line))
                except Exception as exc:  # a line cut short by a crash: nothing can be read of it
                    log.error("memory_spool_unreadable", extra={"error": repr(exc), "line": line[:200]})
            self._keep(jobs)
        return len(jobs)

    async def close(self) -> None:
        """Let go of the spool: what it still holds stays on disk for the next process."""
        if self.directory is not None:
            async with self._order:
                await self._io(self._release)
        self._executor.shutdown(wait=True)

    def _keep(self, jobs: list[MemoryJob]) -> None:
        self._jobs.extend(jobs)
        self._held.update(job.queue for job in jobs)

    async def _io(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # On the spool's thread only, one at a time, in the order they were asked for.

    def _path(self, name: str, suffix: str) -> Path:
        assert self.directory is not None
        return self.directory / f"{name}.{suffix}"

    def _own(self) -> None:
        """Create this process's lock (and so its claim on its spool) the first time it is needed."""
        while self._lock is None:
            assert self.directory is not None
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self._path(self.name, "lock")
            lock = open(path, "ab")  # noqa: SIM115 (held open while the process lives)
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                if os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino:
                    self._lock = lock  # (else another process took it for a stopped one's before we locked it)
                    continue
            except FileNotFoundError:
                pass
            lock.close()

    def _append(self, lines: list[bytes]) -> None:
        self._own()
        with open(self._path(self.name, "spool"), "ab") as file:
            file.write(b"".join(line + b"\n" for line in lines))
            file.flush()
            os.fsync(file.fileno())

    def _rewrite(self, lines: list[bytes]) -> None:
        """The spool holding `lines` only: a new file, fsynced, renamed over the old one."""
        self._own()
        path = self._path(self.name, "spool")
        if not lines:
            path.unlink(missing_ok=True)
            return
        temporary = self._path(self.name, "spool-new")
        with open(temporary, "wb") as file:
            file.write(b"".join(line + b"\n" for line in lines))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)

    def _adopt(self) -> list[bytes]:
        assert self.directory is not None
        taken: list[bytes] = []
        names = {p.stem for p in self.directory.glob("*.lock")} | {p.stem for p in self.directory.glob("*.spool")}
        for name in sorted(names - {self.name}):
            with open(self._path(name, "lock"), "ab") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its process lives
                spool = self._path(name, "spool")
                lines = spool.read_bytes().splitlines() if spool.exists() else []
                if lines:
                    self._append(lines)  # on disk as ours before theirs goes
                    log.warning("memory_spool_adopted", extra={"spool": name, "jobs": len(lines)})
                taken += lines
                for suffix in ("spool", "spool-new", "lock"):
                    self._path(name, suffix).unlink(missing_ok=True)
        return taken

    def _release(self) -> None:
        if self._lock is None:
            return
        spool = self._path(self.name, "spool")
        if not spool.exists() or spool.stat().st_size == 0:  # by the file, whatever was cut short in memory
            spool.unlink(missing_ok=True)
            self._path(self.name, "lock").unlink(missing_ok=True)
        self._lock.close()  # frees the lock: the next process takes over what is left
        self._lock = None
