"""A throwaway certificate authority for tests, made with the openssl command: a CA, server
certificates for 127.0.0.1, and client certificates (etcd takes a client certificate's common name
as its user)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


class TestCA:
    """Files under `d`: ca.pem, and NAME.pem / NAME-key.pem for each certificate issued."""

    __test__ = False  # not a pytest class

    def __init__(self, d: Path, name: str = "twine test CA"):
        self.d = d
        d.mkdir(parents=True, exist_ok=True)
        self.cert, self.key = d / "ca.pem", d / "ca-key.pem"
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(self.key), "-out", str(self.cert), "-days", "2", "-subj", f"/CN={name}",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 cwd=d)

    def issue(self, name: str, server: bool = True, client: bool = True, ips: tuple[str, ...] = ("127.0.0.1",),
              dns: tuple[str, ...] = ("localhost",)) -> Pair:
        cert, key, csr, ext = (self.d / f"{name}.pem", self.d / f"{name}-key.pem", self.d / f"{name}.csr",
                               self.d / f"{name}.ext")
        usage = ",".join(u for u, on in (("serverAuth", server), ("clientAuth", client)) if on)
        san = ",".join([*(f"IP:{i}" for i in ips), *(f"DNS:{n}" for n in dns)])
        ext.write_text(f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                       f"extendedKeyUsage={usage}\n" + (f"subjectAltName={san}\n" if san else ""))
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key),
                 "-out", str(csr), "-subj", f"/CN={name}", cwd=self.d)
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key), "-CAcreateserial",
                 "-out", str(cert), "-days", "2", "-extfile", str(ext), cwd=self.d)
        key.chmod(0o600)
        return Pair(cert, key)
