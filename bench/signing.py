"""Signed bundles: who vouches for a bundle, checked against a keyring.

A bundle (bench/bundle.py) lists the sha256 of each of its members in `bundle.json`; signing it
adds one member, `signature.json`, outside that list:

    {"format": "bench-bundle-signature", "algorithm": "ed25519", "signer": NAME,
     "public_key": HEX (32 bytes), "signature": HEX (64 bytes) over the bytes of bundle.json}

So the signature covers every member through their sums. What each proves (docs/store.md):
a checksum that a member was not corrupted (anyone who edits a member can recompute it); a
signature that the holder of NAME's private key vouched for exactly these bytes (not that the
numbers are true); a re-run (`bench runs verify`) that the numbers come out of the build, config
and seed (bench/verification.py's levels). A keyring is a folder of `NAME.pub` files (the raw
public key in hex, one line); a signature counts only when its public key is the keyring's key
of the name it claims.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from bench.errors import BenchError

SIGNATURE = "signature.json"
FORMAT = "bench-bundle-signature"


class SigningError(BenchError, ValueError):
    """A key or signature that cannot be used or does not hold; the message says why."""


def new_key(name: str, out_dir: Path) -> tuple[Path, Path]:
    """A fresh ed25519 key pair: OUT/NAME.key (the private key, PKCS#8 PEM, mode 600) and
    OUT/NAME.pub (the public key in hex, what a keyring holds)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise SigningError(f"key name {name!r}: use letters, digits, '-', '_' and '.'")
    out_dir.mkdir(parents=True, exist_ok=True)
    key, pub = out_dir / f"{name}.key", out_dir / f"{name}.pub"
    if key.exists() or pub.exists():
        raise SigningError(f"{key} or {pub} exists already: not overwritten")
    private = Ed25519PrivateKey.generate()
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    key.chmod(0o600)
    pub.write_text(_public_hex(private) + "\n")
    return key, pub


def _public_hex(private) -> str:
    from cryptography.hazmat.primitives import serialization

    return private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def load_private_key(path: Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise SigningError(f"{path}: not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{path}: not an ed25519 key")
    return key


def _read(path: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    """The members `names` of the bundle at `path` that it has (the rest is not read: a bundle
    may carry checkpoints of many GB)."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            return {m.name: tar.extractfile(m).read() for m in tar if m.isfile() and m.name in names}
    except (tarfile.TarError, EOFError, OSError) as e:
        raise SigningError(f"{path}: not a readable bundle ({e})") from None


def sign(bundle: Path, key: Path, signer: str) -> dict:
    """Add (or replace) `signature.json` in `bundle`: `signer`'s ed25519 signature over its
    bundle.json. Returns the signature document. The members are copied one at a time."""
    private = load_private_key(key)
    manifest = _read(bundle, ("bundle.json",)).get("bundle.json")
    if manifest is None:
        raise SigningError(f"{bundle}: no bundle.json to sign")
    doc = {"format": FORMAT, "algorithm": "ed25519", "signer": signer, "public_key": _public_hex(private),
           "signature": private.sign(manifest).hex()}
    data = json.dumps(doc, indent=1).encode()
    tmp = bundle.with_name(bundle.name + ".tmp")
    with tarfile.open(bundle, "r:gz") as src, tarfile.open(tmp, "w:gz") as dst:
        for m in src:
            if m.isfile() and m.name != SIGNATURE:
                dst.addfile(m, src.extractfile(m))
        info = tarfile.TarInfo(SIGNATURE)
        info.size, info.mode = len(data), 0o644
        dst.addfile(info, io.BytesIO(data))
    tmp.replace(bundle)
    return doc


def keyring(folder: Path) -> dict[str, str]:
    """{name: public key hex} of the `NAME.pub` files in `folder` ({} when there is none)."""
    out = {}
    for p in sorted(Path(folder).glob("*.pub")) if Path(folder).is_dir() else []:
        text = p.read_text().strip()
        try:
            if len(bytes.fromhex(text)) != 32:
                raise ValueError
        except ValueError:
            raise SigningError(f"{p}: not a 32-byte ed25519 public key in hex") from None
        out[p.stem] = text
    return out


def check(bundle: Path, ring: dict[str, str]) -> str | None:
    """The signer's name when `bundle` carries a signature that holds under `ring`'s key of the
    name it claims; None when it is unsigned; SigningError when it is signed but the signature,
    the key or the name does not hold."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    members = _read(bundle, (SIGNATURE, "bundle.json"))
    if SIGNATURE not in members:
        return None
    try:
        doc = json.loads(members[SIGNATURE])
        signer, key_hex, sig = doc["signer"], doc["public_key"], bytes.fromhex(doc["signature"])
        if not isinstance(signer, str) or not isinstance(key_hex, str):
            raise ValueError("signer and public_key must be strings")
        key = bytes.fromhex(key_hex)
        if doc.get("format") != FORMAT or doc.get("algorithm") != "ed25519":
            raise ValueError("not an ed25519 bench-bundle-signature")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SigningError(f"{bundle}: {SIGNATURE} cannot be read ({e})") from None
    known = ring.get(signer)
    if known is None:
        raise SigningError(f"{bundle} is signed by {signer!r}, whom the keyring does not hold "
                           f"(it holds: {', '.join(ring) or 'no keys'})")
    if bytes.fromhex(known) != key:
        raise SigningError(f"{bundle} is signed as {signer!r} with another key than the keyring's {signer}.pub")
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(known)).verify(sig, members["bundle.json"])
    except (InvalidSignature, KeyError, ValueError):
        raise SigningError(f"{bundle}: {signer}'s signature does not hold over its bundle.json (edited after "
                           "signing)") from None
    return signer
