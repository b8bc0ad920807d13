"""`haremq certs`: the cluster's mutual-TLS material and secret, made once, kept after.

    haremq certs --dir DIR --node hare1 --node hare2 --node hare3 [--operator operator]
                 [--secret DIR/cluster-secret [--secret-from FILE]] [--owner UID:GID]

writes into DIR (the compose file's first-start step runs it into a volume the
members share):

    ca.pem, ca-key.pem        a CA made for this cluster (kept: it signs members added later)
    NAME.pem, NAME-key.pem    each member's certificate, for DNS:NAME, DNS:localhost and
                              IP:127.0.0.1 (--node NAME=SAN,SAN adds names or addresses),
                              good as server and as client (the members' TLS is mutual)
    OPERATOR.pem, -key.pem    a client certificate for `haremq ctl`
    cluster-secret            with --secret: a random secret, or the one in --secret-from
                              unless that is the public example or empty

A file that is already there is left alone (a certificate not signed by DIR's CA is
replaced), so running it at every start changes nothing, and files put there by hand
(bring your own CA and certificates) are used as they are. Keys are P-256, readable by
their owner only (--owner: the uid:gid the nodes run as, when this runs as root).
"""
from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import secrets
import sys
from pathlib import Path

from haremq.cluster.secret import EXAMPLE_SECRET, secrets_of

DAYS = 3650


def _crypto():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:  # pragma: no cover - a dependency; the message says what to install
        raise SystemExit("haremq certs: needs the 'cryptography' package (pip install cryptography)") from None
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _write(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)
    if owner is not None:
        os.chown(tmp, *owner)
    os.replace(tmp, path)


def _key_bytes(key, serialization) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_bytes(cert, serialization) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _sans(names: list[str], x509) -> list:
    out = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


class CertificateAuthority:
    def __init__(self, directory: Path, owner, days: int = DAYS):
        self.x509, self.hashes, self.serialization, self.ec, self.EKU, self.NameOID = _crypto()
        self.dir = directory
        self.owner = owner
        self.days = days
        self.made: list[str] = []
        cert_path, key_path = directory / "ca.pem", directory / "ca-key.pem"
        if cert_path.exists() and key_path.exists():
            self.cert = self.x509.load_pem_x509_certificate(cert_path.read_bytes())
            self.key = self.serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            return
        if cert_path.exists():
            # a CA brought without its key: members' certificates must be brought too
            self.cert, self.key = self.x509.load_pem_x509_certificate(cert_path.read_bytes()), None
            return
        self.key = self.ec.generate_private_key(self.ec.SECP256R1())
        name = self.x509.Name([self.x509.NameAttribute(self.NameOID.COMMON_NAME, "HareMQ cluster CA")])
        now = datetime.datetime.now(datetime.timezone.utc)
        x = self.x509
        self.cert = (x.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=self.days))
                     .add_extension(x.BasicConstraints(ca=True, path_length=0), critical=True)
                     .add_extension(x.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                               content_commitment=False, key_encipherment=False,
                                               data_encipherment=False, key_agreement=False,
                                               encipher_only=False, decipher_only=False), critical=True)
                     .add_extension(x.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
                     .sign(self.key, self.hashes.SHA256()))
        _write(key_path, _key_bytes(self.key, self.serialization), 0o600, owner)
        _write(cert_path, _cert_bytes(self.cert, self.serialization), 0o644, owner)
        self.made.append("ca.pem")

    def _signed_by_me(self, path: Path) -> bool:
        from cryptography.exceptions import InvalidSignature
        try:
            cert = self.x509.load_pem_x509_certificate(path.read_bytes())
            cert.verify_directly_issued_by(self.cert)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return True

    def issue(self, name: str, sans: list[str]) -> None:
        cert_path, key_path = self.dir / f"{name}.pem", self.dir / f"{name}-key.pem"
        if cert_path.exists() and key_path.exists() and (self.key is None or self._signed_by_me(cert_path)):
            return
        if self.key is None:
            raise SystemExit(f"haremq certs: {cert_path} is missing and {self.dir / 'ca-key.pem'} is not there "
                             "to sign it (a CA brought without its key: bring the members' certificates too)")
        x = self.x509
        key = self.ec.generate_private_key(self.ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x.CertificateBuilder()
                .subject_name(x.Name([x.NameAttribute(self.NameOID.COMMON_NAME, name)]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=self.days))
                .add_extension(x.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x.SubjectAlternativeName(_sans(sans, x)), critical=False)
                .add_extension(x.ExtendedKeyUsage([self.EKU.SERVER_AUTH, self.EKU.CLIENT_AUTH]), critical=False)
                .add_extension(x.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                               critical=False)
                .sign(self.key, self.hashes.SHA256()))
        _write(key_path, _key_bytes(key, self.serialization), 0o600, self.owner)
        _write(cert_path, _cert_bytes(cert, self.serialization), 0o644, self.owner)
        self.made.append(f"{name}.pem")


def write_secret(path: Path, given: Path | None, owner) -> str:
    """The cluster secret file: the one given, unless it is the public example or empty (then
    the one already made, or a new random one). Says what it did."""
    text = ""
    if given is not None and given.exists():
        text = "\n".join(secrets_of(given.read_text()))
    if text and EXAMPLE_SECRET not in secrets_of(text):
        if path.exists() and path.read_text().strip() == text:
            return "cluster secret: as given, unchanged"
        _write(path, (text + "\n").encode(), 0o600, owner)
        return "cluster secret: written from the one given"
    if path.exists() and path.read_text().strip():
        return "cluster secret: kept"
    _write(path, (secrets.token_urlsafe(32) + "\n").encode(), 0o600, owner)
    return "cluster secret: generated"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="haremq certs", description="Make (once) a CA, member and operator "
                                     "certificates for the cluster port's mutual TLS, and a cluster secret.")
    parser.add_argument("--dir", type=Path, required=True, help="where the files go (made if missing)")
    parser.add_argument("--node", action="append", default=[], metavar="NAME[=SAN,...]",
                        help="a member: NAME.pem for DNS:NAME, localhost, 127.0.0.1 and the SANs given")
    parser.add_argument("--operator", action="append", default=[], metavar="NAME",
                        help="a client certificate NAME.pem for `haremq ctl`")
    parser.add_argument("--secret", type=Path, help="write the cluster secret to this file (kept once made)")
    parser.add_argument("--secret-from", type=Path, help="the secret to use, unless it is the public example")
    parser.add_argument("--owner", metavar="UID:GID", help="owner of the files written (when run as root)")
    parser.add_argument("--days", type=int, default=DAYS, help=f"certificates' lifetime (default {DAYS})")
    args = parser.parse_args(argv)
    owner = None
    if args.owner:
        try:
            uid, gid = (int(p) for p in args.owner.split(":", 1))
        except ValueError:
            parser.error(f"--owner {args.owner!r} is not UID:GID")
        owner = (uid, gid)
    args.dir.mkdir(parents=True, exist_ok=True)
    if owner is not None:
        os.chown(args.dir, *owner)
    ca = CertificateAuthority(args.dir, owner, args.days)
    for spec in args.node:
        name, _, extra = spec.partition("=")
        ca.issue(name, [name, "localhost", "127.0.0.1", *[s for s in extra.split(",") if s]])
    for name in args.operator:
        ca.issue(name, [name])
    print(f"haremq certs: {args.dir}: " + (f"made {', '.join(ca.made)}" if ca.made else "certificates kept"),
          flush=True)
    if args.secret is not None:
        print(f"haremq certs: {write_secret(args.secret, args.secret_from, owner)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
