"""Just enough PNG decoding to look at a screenshot: non-interlaced 8-bit RGB or RGBA, all five row filters
(PNG specification, section 9: None, Sub, Up, Average, Paeth), as headless Chromium writes them."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Image:
    width: int
    height: int
    channels: int
    rows: tuple[bytes, ...]  # unfiltered scanlines

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        i = x * self.channels
        r, g, b = self.rows[y][i : i + 3]
        return r, g, b


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def decode(data: bytes) -> Image:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, chunk = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header[:13])
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                line[i] = (line[i] + _paeth(left, up, corner)) & 0xFF
        rows.append(bytes(line))
        previous = line
    return Image(width, height, channels, tuple(rows))


def rows_with_both(image: Image, a: tuple[int, int, int], b: tuple[int, int, int]) -> int:
    """How many pixel rows hold both colours somewhere: e.g. a pill's fill inside a tinted table row."""
    count = 0
    for y in range(image.height):
        seen = {image.pixel(x, y) for x in range(0, image.width, 2)}
        count += a in seen and b in seen
    return count
