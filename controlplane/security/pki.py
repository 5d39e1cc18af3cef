"""A region's own certificate authority, made with the openssl command (Debian's openssl): a CA,
server certificates for the addresses a service answers on, and client certificates (etcd takes a
client certificate's common name as its user). The local dev region makes one at start; tests
make throwaway ones. Keys are EC P-256, readable by their owner only; certificates last `days`."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path | None = None, check: bool = True) -> bool:
    """Runs openssl; RuntimeError when it fails, or with check=False, whether it succeeded."""
    try:
        subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise RuntimeError("the openssl command is missing (Debian: apt-get install openssl)") from None
    except subprocess.CalledProcessError as e:
        if not check:
            return False
        raise RuntimeError(f"openssl {args[0]} failed: {e.stderr.strip()[-500:]}") from None
    return True


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


class CA:
    """Files under `d`: ca.pem, and NAME.pem / NAME-key.pem for each certificate issued."""

    def __init__(self, d: Path, name: str = "twine region CA", days: int = 30, ca_days: int | None = None):
        """A new CA in `d`, valid `ca_days` (default `days`); the certificates it issues last `days`.
        A CA already there is kept, not made anew (that would void every certificate it signed):
        RuntimeError names `CA.existing`."""
        self.d = d
        self.days = days
        self.cert, self.key = d / "ca.pem", d / "ca-key.pem"
        if self.cert.exists() or self.key.exists():
            raise RuntimeError(f"{d} holds a CA already: use it (CA.existing) or remove it first")
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(self.key), "-out", str(self.cert), "-days", str(ca_days or days), "-subj", f"/CN={name}",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 cwd=d)
        self.key.chmod(0o600)

    @classmethod
    def existing(cls, d: Path, days: int = 365) -> "CA | None":
        """The CA already in `d`, or None."""
        if not (d / "ca.pem").exists() or not (d / "ca-key.pem").exists():
            return None
        ca = cls.__new__(cls)
        ca.d, ca.days, ca.cert, ca.key = d, days, d / "ca.pem", d / "ca-key.pem"
        return ca

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
                 "-out", str(cert), "-days", str(self.days), "-extfile", str(ext), cwd=self.d)
        key.chmod(0o600)
        csr.unlink()
        ext.unlink()
        return Pair(cert, key)

    def current(self, name: str, margin_days: int = 30) -> bool:
        """Whether NAME.pem is there, signed by this CA, and valid `margin_days` more days."""
        cert = self.d / f"{name}.pem"
        if not cert.exists() or not (self.d / f"{name}-key.pem").exists():
            return False
        return _openssl("verify", "-CAfile", str(self.cert), str(cert), check=False) and \
            _openssl("x509", "-checkend", str(margin_days * 86400), "-noout", "-in", str(cert), check=False)


def main(argv: list[str] | None = None) -> int:
    """`python -m controlplane.security.pki DIR --server NAME --ip IP ... --client NAME ...`: a CA in DIR
    unless one is there, a server certificate NAME for the addresses given, a client certificate
    NAME (test regions: the Vagrantfile; etcd's certificates: install-controld.sh). A certificate
    already in DIR is kept while it is signed by DIR's CA and valid 30 more days; else it is issued
    again (run it again to renew). The CA lasts --ca-days, its certificates --days."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m controlplane.security.pki", description=main.__doc__)
    p.add_argument("dir", type=Path)
    p.add_argument("--server", action="append", default=[], metavar="NAME", help="a server certificate to issue")
    p.add_argument("--client", action="append", default=[], metavar="NAME",
                   help="a client certificate to issue, NAME its common name (etcd's user)")
    p.add_argument("--ip", action="append", default=[], help="an address the servers answer on (repeat)")
    p.add_argument("--days", type=int, default=365, help="how long the certificates it issues last")
    p.add_argument("--ca-days", type=int, default=3650, help="how long a new CA lasts")
    args = p.parse_args(argv)
    try:
        ca = CA.existing(args.dir, days=args.days) or CA(args.dir, days=args.days, ca_days=args.ca_days)
        for name, server in [*((n, True) for n in args.server), *((n, False) for n in args.client)]:
            if ca.current(name):
                continue
            if server:
                ca.issue(name, ips=tuple(args.ip) or ("127.0.0.1",))
            else:
                ca.issue(name, server=False, ips=(), dns=())
            print(f"pki: issued {name} ({args.dir / name}.pem, {args.days} days)")
    except RuntimeError as e:
        print(f"pki: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
