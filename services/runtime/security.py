"""Credentials and TLS for the bus: a CA and two server certificates made at set-up,
one generated password per NATS user (the server's configuration holds only its bcrypt
hash), and the one way every Koi process opens a NATS connection (``connect_options``).

``init_security(root)`` makes (once; later calls reuse what exists) this layout, every
file 0600:

    root/pki/ca.pem, ca-key.pem              the CA
    root/pki/server.pem, server-key.pem      NATS's certificate
    root/pki/grpc.pem, grpc-key.pem          planner-api's gRPC certificate
    root/users/<role>/password, ca.pem       what one service mounts
    root/users/<role>/password.bcrypt        its hash, for the server's configuration
    root/users/<submitter>/…                 the same for each submitter added with
                                             ``submitters`` (``client`` is one already)
    root/grpc/token, server.pem, server-key.pem   what planner-api mounts (its own
                                             certificate and key, copied)
    root/nats-auth.conf                      accounts (bcrypt hashes) + tls, to include
    root/nats.conf                           a whole server config

NATS and gRPC have separate certificates and keys (same CA), so a leak of one server's
key impersonates only that server; planner-api mounts neither the CA key, NATS's key nor
anyone's password; its bearer token is made once and kept. Which role may publish what
is ``services/runtime/permissions.py``. No secret is ever logged, put in an exception
message, a command line or a repr.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from koi import subjects
from services.runtime.logs import quiet_library_noise
from services.runtime.permissions import ADMIN, CLIENT, ROLES, accounts_block, submitter_name
from services.runtime.settings import NatsAuth

log = structlog.get_logger(__name__)

_CA_DAYS = 3650
# bcrypt's cost for the NATS users' password hashes: nats-server's own ``mkpasswd``
# default; the server checks a hash once per connection (tenths of a second on 2 cores)
BCRYPT_ROUNDS = 11
_CERT_DAYS = 825
_LOCAL_SANS = ("localhost", "127.0.0.1", "::1")


def write_secret(path: Path, data: bytes | str) -> None:
    """Write ``path`` readable by its owner only (0600), never wider even for a moment."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(raw)
    os.chmod(path, 0o600)  # an existing file keeps its old mode through O_CREAT


# --- PKI -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pki:
    """Where the CA and the two server certificates (NATS, gRPC) lie (PEM files)."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca-key.pem"

    @property
    def server_cert(self) -> Path:
        return self.dir / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.dir / "server-key.pem"

    @property
    def grpc_cert(self) -> Path:
        return self.dir / "grpc.pem"

    @property
    def grpc_key(self) -> Path:
        return self.dir / "grpc-key.pem"


def _name(common_name: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Koi"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(names: Iterable[str]) -> Any:
    from cryptography import x509

    out: list[Any] = []
    for name in dict.fromkeys(names):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(out)


def _issue_ca(pki: Pki) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("Koi CA")).issuer_name(_name("Koi CA"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=_CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    write_secret(pki.ca_key, key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    write_secret(pki.ca_cert, cert.public_bytes(serialization.Encoding.PEM))


def _issue_server(pki: Pki, sans: tuple[str, ...], cert_path: Path, key_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), None)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (x509.CertificateBuilder().subject_name(_name(sans[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=_CERT_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False,
                                         False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(_san(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]  # an EC key
    write_secret(key_path, key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
    write_secret(cert_path, cert.public_bytes(serialization.Encoding.PEM))


def _covers(cert_path: Path, sans: tuple[str, ...]) -> bool:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        have = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    names = {str(v) for v in have.get_values_for_type(x509.IPAddress)}
    names |= set(have.get_values_for_type(x509.DNSName))
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return set(_san(sans).get_values_for_type(x509.DNSName)) | {
        str(v) for v in _san(sans).get_values_for_type(x509.IPAddress)} <= names and \
        left > datetime.timedelta(days=30)


def ensure_pki(dir: Path, sans: Iterable[str] = ()) -> Pki:
    """A CA and two server certificates, NATS's and gRPC's, each for
    127.0.0.1/localhost/::1 plus ``sans`` (host names or IP addresses), in ``dir``: made
    once, reused after; a certificate is re-issued (same CA, new key) when it lacks a
    name asked for or expires within 30 days."""
    pki = Pki(Path(dir))
    wanted = tuple(dict.fromkeys((*_LOCAL_SANS, *sans)))
    if not (pki.ca_cert.is_file() and pki.ca_key.is_file()):
        _issue_ca(pki)
        log.info("pki_ca_created", dir=str(pki.dir))
    for which, cert, key in (("nats", pki.server_cert, pki.server_key),
                             ("grpc", pki.grpc_cert, pki.grpc_key)):
        if not (key.is_file() and _covers(cert, wanted)):
            _issue_server(pki, wanted, cert, key)
            log.info("pki_server_cert_issued", dir=str(pki.dir), server=which,
                     names=list(wanted))
    return pki


# --- users and the server's configuration ---------------------------------------------
@dataclass(frozen=True)
class Security:
    """One installation's secrets directory (see the module docstring for its layout)."""

    root: Path
    pki: Pki

    def password_file(self, role: str) -> Path:
        return self.root / "users" / role / "password"

    def ca_file(self, role: str) -> Path:
        return self.root / "users" / role / "ca.pem"

    def auth(self, role: str = ADMIN) -> NatsAuth:
        """The credentials of ``role`` (admin by default), read from its files."""
        return NatsAuth(role, self.password_file(role).read_text().strip(),
                        str(self.ca_file(role)))

    def env_for(self, role: str) -> dict[str, str]:
        """The variables a process of ``role`` runs with (its password by file)."""
        return {"KOI_NATS_USER": role, "KOI_NATS_PASSWORD": "",
                "KOI_NATS_PASSWORD_FILE": str(self.password_file(role)),
                "KOI_NATS_CA": str(self.ca_file(role))}

    def service_env(self, services: Iterable[str]) -> dict[str, dict[str, str]]:
        """``Supervisor.service_env`` for ``services``: each runs as its own user."""
        return {name: self.env_for(name) for name in services}

    def hash_file(self, role: str) -> Path:
        return self.root / "users" / role / "password.bcrypt"

    def submitters(self) -> tuple[str, ...]:
        """The submitters added besides ``client`` (each a directory under users/)."""
        users = self.root / "users"
        found = users.iterdir() if users.is_dir() else iter(())
        return tuple(sorted(d.name for d in found
                            if d.name not in ROLES and (d / "password").is_file()))

    def users(self) -> tuple[str, ...]:
        """Every NATS user: one per role, then the extra submitters."""
        return (*ROLES, *self.submitters())

    def passwords(self) -> dict[str, str]:
        return {user: self.password_file(user).read_text().strip() for user in self.users()}

    def password_hashes(self) -> dict[str, str]:
        """Each user's bcrypt hash (what the server's configuration holds)."""
        return {user: self.hash_file(user).read_text().strip() for user in self.users()}

    @property
    def grpc_dir(self) -> Path:
        return self.root / "grpc"

    @property
    def grpc_token_file(self) -> Path:
        return self.grpc_dir / "token"

    @property
    def grpc_cert(self) -> Path:
        return self.grpc_dir / "server.pem"

    @property
    def grpc_key(self) -> Path:
        return self.grpc_dir / "server-key.pem"


def _ensure_users(sec: Security, users: Iterable[str]) -> None:
    ca = sec.pki.ca_cert.read_bytes()
    for role in users:
        password, hashed = sec.password_file(role), sec.hash_file(role)
        if not password.is_file():
            write_secret(password, secrets.token_urlsafe(32) + "\n")
        if not hashed.is_file() or hashed.stat().st_mtime_ns < password.stat().st_mtime_ns:
            write_secret(hashed, hash_password(password.read_text().strip()) + "\n")
        write_secret(sec.ca_file(role), ca)


def hash_password(password: str, rounds: int = BCRYPT_ROUNDS) -> str:
    """The bcrypt hash nats-server accepts in place of a password (``$2a$`` form, as its
    ``mkpasswd`` writes)."""
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds, prefix=b"2a")).decode()


def _ensure_grpc(sec: Security) -> None:
    """planner-api's files: a bearer token (made once, kept after) and copies of its own
    certificate and key (rewritten: a re-issued certificate reaches it too)."""
    if not sec.grpc_token_file.is_file():
        write_secret(sec.grpc_token_file, secrets.token_urlsafe(32))
    write_secret(sec.grpc_cert, sec.pki.grpc_cert.read_bytes())
    write_secret(sec.grpc_key, sec.pki.grpc_key.read_bytes())


def server_tls_block(pki: Pki, mount: Path | None = None) -> str:
    """The ``tls`` section: the server's certificate (paths as the server sees them:
    under ``mount`` instead of ``pki.dir``'s parent when it runs elsewhere, e.g. in a
    container)."""
    base = pki.dir if mount is None else Path(mount) / pki.dir.name
    return (f"tls {{\n  cert_file: {json.dumps(str(base / pki.server_cert.name))}\n"
            f"  key_file: {json.dumps(str(base / pki.server_key.name))}\n  timeout: 2\n"
            # TLS before anything else: no INFO in the clear, and a client never meets a
            # server that can talk it out of TLS (see connect_options)
            f"  handshake_first: true\n}}\n")


def init_security(root: Path, *, sans: Iterable[str] = (), listen: str = "0.0.0.0:4222",
                  store_dir: str = "/data", monitor: str = "0.0.0.0:8222",
                  mount: Path | None = None, max_payload_mb: int = 8,
                  submitters: Iterable[str] = ()) -> Security:
    """Make (or complete) ``root``: PKI, a password per role and per submitter in
    ``submitters`` (added to those made before: none is ever dropped), planner-api's gRPC
    token and TLS files, ``nats-auth.conf`` (accounts and TLS, to include from an existing
    config) and ``nats.conf`` (a whole server: ``listen``, JetStream in ``store_dir``,
    monitoring on ``monitor``). ``mount`` is where ``root`` appears to the server when
    that is not ``root`` itself."""
    root = Path(root)
    added = [submitter_name(u) for u in submitters if u != CLIENT]  # refused before writing
    sec = Security(root, ensure_pki(root / "pki", sans))
    _ensure_users(sec, dict.fromkeys((*ROLES, *sec.submitters(), *added)))
    _ensure_grpc(sec)
    auth = accounts_block(sec.password_hashes(), sec.submitters()) + \
        server_tls_block(sec.pki, mount)
    write_secret(root / "nats-auth.conf", auth)
    write_secret(root / "nats.conf",
                 f"listen: {listen}\nhttp: {monitor}\n"
                 f"max_payload: {max_payload_mb * 1024 * 1024}\n"
                 f"jetstream {{\n  store_dir: {json.dumps(store_dir)}\n}}\n"
                 f"include \"nats-auth.conf\"\n")
    return sec


def load_security(root: Path) -> Security:
    """An existing secrets directory (``init_security`` made it)."""
    sec = Security(Path(root), Pki(Path(root) / "pki"))
    if not sec.pki.ca_cert.is_file():
        raise FileNotFoundError(f"{root} holds no Koi secrets; run `koi security init {root}`")
    return sec


# --- clients -----------------------------------------------------------------------------
def tls_context(ca_file: str | Path) -> ssl.SSLContext:
    """A client TLS context trusting ``ca_file`` only, with host names checked."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_file))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def connect_options(auth: NatsAuth | None = None, url: str = "") -> dict[str, Any]:
    """``nats.connect`` keyword arguments for ``auth`` (default: from ``KOI_NATS_*``):
    user and password when given; TLS when ``KOI_NATS_CA`` is set (trusting it) or a
    server in ``url`` is ``tls://`` (trusting the system's store).

    TLS is then done first, before the server says a word: nats-py otherwise upgrades
    only when the server's INFO asks for it, even for a ``tls://`` URL, so a plaintext
    impostor could collect the password. The server must have ``handshake_first`` on
    (``server_tls_block`` writes it)."""
    quiet_library_noise()  # asyncio's TLS warning on every closed connection: debug only
    auth = NatsAuth.from_env() if auth is None else auth
    options: dict[str, Any] = {}
    if auth.user:
        options.update(user=auth.user, password=auth.password)
    if auth.ca_file or any(u.startswith("tls://") for u in servers(url)):
        options["tls"] = tls_context(auth.ca_file) if auth.ca_file else \
            ssl.create_default_context()
        options["tls_handshake_first"] = True
    return options


def submit_subject(auth: NatsAuth | None = None) -> str:
    """Where this process submits jobs: ``koi.jobs.submit.<its NATS user>`` (default: from
    ``KOI_NATS_*``), ``koi.jobs.submit.client`` without a user."""
    auth = NatsAuth.from_env() if auth is None else auth
    return subjects.job_submit_subject(auth.user or subjects.DEFAULT_SUBMITTER)


def servers(url: str) -> list[str]:
    """The server list of a comma-separated ``KOI_NATS_URL``."""
    return [u.strip() for u in url.split(",") if u.strip()]


async def connect_nats(url: str, auth: NatsAuth | None = None, **kwargs: Any) -> Any:
    """A plain nats-py client (for the CLI, the demo's monitor, tests) with Koi's
    credentials and TLS applied; ``kwargs`` go to ``nats.connect``."""
    import nats

    return await nats.connect(servers(url), **connect_options(auth, url), **kwargs)


def init_command(root: Path, sans: Iterable[str] = (), mount: Path | None = None,
                 listen: str = "0.0.0.0:4222", store_dir: str = "/data",
                 submitters: Iterable[str] = ()) -> str:
    """``koi security init``: make ``root`` and say what is where (never a secret)."""
    sec = init_security(root, sans=sans, mount=mount, listen=listen, store_dir=store_dir,
                        submitters=submitters)
    extra = ", ".join(sec.submitters()) or "none"
    return "\n".join([
        f"CA and server certificate: {sec.pki.dir} (CA {sec.pki.ca_cert.name})",
        f"one user per role ({', '.join(ROLES)}): {root / 'users'}/<role>/password, ca.pem",
        f"submitters besides {CLIENT} ({extra}): the same files under {root / 'users'}/<name>"
        "; each submits on koi.jobs.submit.<name> only",
        f"nats-server config: {root / 'nats.conf'} (includes {root / 'nats-auth.conf'};"
        " both hold the passwords: keep them 0600)",
        "a service runs with KOI_NATS_USER=<role>, KOI_NATS_PASSWORD_FILE=<its password "
        "file>, KOI_NATS_CA=<its ca.pem>",
        f"planner-api's gRPC: bearer token {sec.grpc_token_file} (made once, kept), "
        f"TLS {sec.grpc_cert} and {sec.grpc_key} (copies of the server's)",
        "planner-api runs with KOI_GRPC_TOKEN_FILE, KOI_GRPC_TLS_CERT, KOI_GRPC_TLS_KEY "
        "naming them; a client trusts the CA and sends 'authorization: Bearer <token>'"])
