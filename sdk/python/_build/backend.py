"""A PEP 517 build backend in the standard library alone, so that
``pip install ./sdk/python`` needs no setuptools, wheel or network: it packs
the pure-Python ``libdsec`` package into a wheel (and an sdist)."""

import base64
import hashlib
import io
import os
import tarfile
import zipfile

NAME, VERSION = "libdsec", "0.1.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: Python SDK of dsec: sandboxes for agentic RL at scale (standard library only)
License: Apache-2.0
Requires-Python: >=3.9
"""
WHEEL = "Wheel-Version: 1.0\nGenerator: libdsec-backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _files():
    for d, _, names in os.walk(os.path.join(HERE, NAME)):
        for n in sorted(names):
            if n.endswith((".py", ".typed")):
                full = os.path.join(d, n)
                yield full, os.path.relpath(full, HERE).replace(os.sep, "/")


def get_requires_for_build_wheel(config_settings=None):
    return []


get_requires_for_build_sdist = get_requires_for_build_wheel
get_requires_for_build_editable = get_requires_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    dist = f"{NAME}-{VERSION}.dist-info"
    record = []

    def add(zf, arc, data):
        zf.writestr(arc, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")

    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as zf:
        for full, arc in _files():
            with open(full, "rb") as f:
                add(zf, arc, f.read())
        add(zf, f"{dist}/METADATA", METADATA.encode())
        add(zf, f"{dist}/WHEEL", WHEEL.encode())
        record.append(f"{dist}/RECORD,,")
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{VERSION}"
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tf:
        for rel in ["pyproject.toml", "README.md", "_build/backend.py"] + [arc for _, arc in _files()]:
            tf.add(os.path.join(HERE, rel), arcname=f"{base}/{rel}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = METADATA.encode()
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return name
