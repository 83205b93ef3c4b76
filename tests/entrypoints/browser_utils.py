"""Headless Chromium (Debian's `chromium`; scripts/install_test_deps.sh installs it) for page tests, and a
PNG reader."""

import re
import shutil
import struct
import subprocess
import tempfile
import zlib

import numpy as np

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1200,1100",
]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def run_chromium(url: str, *args: str, virtual_time_ms: int = 4000, timeout_s: float = 60) -> str:
    """Load `url` (a fresh profile each time), let its timers and fetches run for `virtual_time_ms`,
    then do what `args` ask (--screenshot=PATH, --dump-dom). Returns stdout."""
    executable = chromium()
    assert executable, "chromium is not installed (apt-get install -y chromium)"
    with tempfile.TemporaryDirectory(prefix="pagedserve-chromium-") as profile:
        result = subprocess.run(
            [
                executable,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={virtual_time_ms}",
                *args,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def text_by_id(dom: str, element_id: str) -> str:
    """The text of the element with `id` in a dumped DOM (nested tags removed)."""
    match = re.search(rf'<(\w+)[^>]*\bid="{element_id}"[^>]*>(.*?)</\1>', dom, re.S)
    assert match, f"no element #{element_id} in the page"
    return re.sub(r"<[^>]+>", "", match.group(2)).strip()


def read_png(path: str) -> np.ndarray:
    """An 8-bit RGB or RGBA PNG as an array [height, width, channels] (what Chromium writes)."""
    with open(path, "rb") as file:
        data = file.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    offset, chunks, header = 8, [], b""
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset : offset + 8])
        body = data[offset + 8 : offset + 8 + length]
        header = body if kind == b"IHDR" else header
        if kind == b"IDAT":
            chunks.append(body)
        offset += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6), f"unsupported PNG (depth {depth}, color type {color})"
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(b"".join(chunks)), width * bpp
    rows: list[bytearray] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        row = _unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), previous, bpp)
        rows.append(row)
        previous = row
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(height, width, bpp)


def _unfilter(kind: int, line: bytearray, up: bytearray, bpp: int) -> bytearray:
    """Undo one row's PNG filter (None, Sub, Up, Average, Paeth)."""
    if kind == 0:
        return line
    if kind == 2:
        return bytearray((a + b) & 0xFF for a, b in zip(line, up))
    for x in range(len(line)):
        left = line[x - bpp] if x >= bpp else 0
        if kind == 1:
            predictor = left
        elif kind == 3:
            predictor = (left + up[x]) >> 1
        else:
            upper_left = up[x - bpp] if x >= bpp else 0
            p = left + up[x] - upper_left
            pa, pb, pc = abs(p - left), abs(p - up[x]), abs(p - upper_left)
            predictor = left if pa <= pb and pa <= pc else up[x] if pb <= pc else upper_left
        line[x] = (line[x] + predictor) & 0xFF
    return line
