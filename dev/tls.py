"""A throw-away CA and a server certificate signed by it, for trying (and testing) the HTTP
API over HTTPS: ``MEMSTREAM_WEB_TLS_CERT`` / ``MEMSTREAM_WEB_TLS_KEY`` name the server's
files, ``MEMSTREAM_WEB_TLS_CA`` (the workers' forwards) and the client's ``verify=`` the CA.
Never for production: the keys are written unencrypted. The openssl equivalent::

    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \\
        -subj "/CN=memstream dev CA" -keyout ca.key -out ca.pem
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \\
        -subj "/CN=localhost" -keyout server.key -out server.csr
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \\
        -extfile <(printf "subjectAltName=DNS:localhost,IP:127.0.0.1") -out server.pem
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA certificate (PEM): what peers verify with
    cert: Path  # the server certificate (PEM)
    key: Path  # the server's private key (PEM, unencrypted)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write_dev_tls(folder: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                  days: int = 30) -> TlsFiles:
    """A CA and a server certificate for ``hosts`` (names and IP addresses), into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("memstream dev CA"))
          .issuer_name(_name("memstream dev CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(_pem_key(key))
    files.key.chmod(0o600)
    return files


if __name__ == "__main__":  # python -m memstream.dev.tls DIR [HOST ...]
    import sys

    if len(sys.argv) < 2:
        sys.exit("usage: python -m memstream.dev.tls DIR [HOST ...]")
    made = write_dev_tls(Path(sys.argv[1]), tuple(sys.argv[2:]) or ("localhost", "127.0.0.1"))
    print(f"MEMSTREAM_WEB_TLS_CERT={made.cert}\nMEMSTREAM_WEB_TLS_KEY={made.key}\n"
          f"MEMSTREAM_WEB_TLS_CA={made.ca}")
