"""Text-line images for the OCR demo, rendered here with fonts that need no download.

The default font is the one Pillow carries inside its own package (``ImageFont.load_default``
with a size, FreeType-rendered since Pillow 10.1), so the demo renders the same lines on any
machine with the ``demo`` extra installed; ``--font`` adds font files of the user's.  Lines
are seeded, so a run is reproducible.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

__all__ = ["TextLine", "render_lines", "preprocess", "ctc_greedy_decode", "edit_distance",
           "load_fonts"]

# Words for synthetic lines: everyday English of invoices, signs and forms.
_WORDS = """
total amount invoice date order number customer address street road avenue city phone
email account balance payment due paid received shipping delivery item quantity price tax
discount subtotal station platform exit entrance open closed monday tuesday wednesday
thursday friday saturday sunday january february march april june july august september
october november december north south east west left right first second third floor room
building office hospital school library museum market bank hotel airport parking ticket
gate seat flight train bus coffee tea water bread milk cheese apple orange lemon sugar
salt rice chicken fish beef salad soup pizza menu special today fresh hot cold large small
medium free sale new best quality service hours welcome thank you please call visit online
store limited edition model serial version report page chapter section figure table note
warning caution danger stop slow speed limit zone area no entry only staff private public
""".split()
_PUNCT = [".", ",", ":", "-", "/", "#", "%", "(", ")", "&", "+", "$"]


@dataclass
class TextLine:
    """One rendered line: its text and an RGB uint8 image (H, W, 3)."""
    text: str
    image: np.ndarray


def load_fonts(paths: Sequence[str] = (), sizes: Sequence[int] = (28, 32, 36, 40)) -> list:
    """Pillow's built-in font at ``sizes``, plus every font file in ``paths`` at the same
    sizes.  Raises ``RuntimeError`` if Pillow was built without FreeType (then only a tiny
    bitmap font exists, too small for the recognizer)."""
    from PIL import ImageFont
    fonts = []
    for size in sizes:
        f = ImageFont.load_default(size=size)
        if not isinstance(f, ImageFont.FreeTypeFont):
            raise RuntimeError("Pillow has no FreeType support here; pass --font FILE.ttf")
        fonts.append(f)
        for p in paths:
            fonts.append(ImageFont.truetype(p, size))
    return fonts


def _random_text(rng: random.Random, charset: Optional[set[str]]) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.55:
            w = rng.choice(_WORDS)
            style = rng.random()
            parts.append(w.upper() if style < 0.2 else w.capitalize() if style < 0.55 else w)
        elif kind < 0.75:
            parts.append(str(rng.randint(0, 99999)))
        elif kind < 0.85:
            parts.append(f"{rng.randint(1, 999)}.{rng.randint(0, 99):02d}")
        elif kind < 0.93:
            parts.append(f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/"
                         f"{rng.randint(1990, 2030)}")
        else:
            parts.append(rng.choice(_WORDS) + rng.choice(_PUNCT))
    text = " ".join(parts)
    if charset is not None:
        text = "".join(c for c in text if c == " " or c in charset)
    return " ".join(text.split()) or "0"


def render_lines(n: int, seed: int = 0, fonts: Optional[list] = None,
                 charset: Optional[set[str]] = None) -> list[TextLine]:
    """``n`` reproducible text lines (seeded), dark text on a light background with random
    font size, margins, contrast and mild noise; characters outside ``charset`` are left
    out of the text."""
    from PIL import Image, ImageDraw
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    fonts = fonts or load_fonts()
    lines = []
    for _ in range(n):
        text = _random_text(rng, charset)
        font = rng.choice(fonts)
        left, top, right, bottom = font.getbbox(text)
        mx, my = rng.randint(4, 16), rng.randint(3, 10)
        w, h = right - left + 2 * mx, bottom - top + 2 * my
        bg = rng.randint(190, 255)
        fg = rng.randint(0, 70)
        img = Image.new("RGB", (w, h), (bg, bg, bg))
        ImageDraw.Draw(img).text((mx - left, my - top), text, font=font, fill=(fg, fg, fg))
        arr = np.asarray(img, dtype=np.float32)
        arr = arr + nrng.normal(0.0, rng.uniform(0.0, 8.0), size=arr.shape)
        lines.append(TextLine(text, np.clip(arr, 0, 255).astype(np.uint8)))
    return lines


def preprocess(image: np.ndarray, height: int = 48, max_width: int = 1600) -> np.ndarray:
    """A (1, 3, height, W) float32 batch as PP-OCR recognizers expect: resized to ``height``
    keeping the aspect ratio, scaled to [-1, 1]."""
    from PIL import Image
    h, w = image.shape[:2]
    new_w = min(max_width, max(16, int(math.ceil(height * w / h))))
    resized = Image.fromarray(image).resize((new_w, height), Image.BILINEAR)
    x = np.asarray(resized, dtype=np.float32).transpose(2, 0, 1) / 255.0
    return ((x - 0.5) / 0.5)[None].astype(np.float32)


def ctc_greedy_decode(probs: np.ndarray, characters: Sequence[str]) -> list[str]:
    """Best-path CTC decoding of (batch, time, classes) scores: argmax per step, repeats
    merged, blanks (class 0) dropped; class i >= 1 is ``characters[i - 1]``."""
    best = probs.argmax(axis=-1)
    out = []
    for row in best:
        keep = np.ones(len(row), dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != 0
        out.append("".join(characters[i - 1] for i in row[keep] if i - 1 < len(characters)))
    return out


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions each cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]
