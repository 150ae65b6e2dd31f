#!/usr/bin/env python3
"""A certificate authority made for one test run (needs Python's cryptography).

    python3 tests/test_ca.py DIR

Writes into DIR: ca.pem (the test CA), and, each signed by it with its key beside it,
server.pem/server.key (for 127.0.0.1 and localhost, valid now), expired.pem/expired.key
(the same names, expired a day ago) and wrong-name.pem/wrong-name.key (valid now, for
wrong.example only).
"""

import datetime
import ipaddress
import os
import sys

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write(path, data):
    with open(path, "wb") as out:
        out.write(data)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("mailer test CA"))
        .issuer_name(name("mailer test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - 10 * day)
        .not_valid_after(now + 10 * day)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    write(os.path.join(out, "ca.pem"), ca.public_bytes(serialization.Encoding.PEM))
    local = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    leaves = {
        "server": (now - day, now + 5 * day, local),
        "expired": (now - 5 * day, now - day, local),
        "wrong-name": (now - day, now + 5 * day, [x509.DNSName("wrong.example")]),
    }
    for leaf, (not_before, not_after, names) in leaves.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(leaf))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        write(os.path.join(out, f"{leaf}.pem"), cert.public_bytes(serialization.Encoding.PEM))
        write(
            os.path.join(out, f"{leaf}.key"),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption()))


if __name__ == "__main__":
    main()
