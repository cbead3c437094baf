"""Images made fit for the model: within the Messages API's limits (at most 8000 px a side,
5 MB encoded) and no larger than the model can use (about 1568 px on the long edge, beyond
which the API scales them down itself, at the cost of latency). Pillow reads them; a picture
whose header claims more pixels than `MAX_PIXELS` is refused before it is decoded."""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

from sessions.files.limits import FittedImage

LONG_EDGE = 1568
MAX_BYTES = 5 * 1024 * 1024
MAX_PIXELS = 60_000_000
API_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


class ImageProblemError(Exception):
    """The image cannot be shown to the model; the message says why, for the reply."""


def fit_image(data: bytes, media_type: str) -> FittedImage:
    """The image as it is when it already fits, else scaled down and re-encoded."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                if width * height > MAX_PIXELS:
                    raise ImageProblemError(f"it is too large ({width} by {height} pixels)")
                fits = max(width, height) <= LONG_EDGE and len(data) <= MAX_BYTES
                if fits and media_type in API_TYPES:
                    image.verify()  # a truncated or corrupt file fails here, not at the API
                    return FittedImage(data, media_type, width, height)
                return _scaled(image)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise ImageProblemError("it is too large to open safely") from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise ImageProblemError("it is damaged or not an image I can read") from exc


def _scaled(image: Image.Image) -> FittedImage:
    image.draft("RGB", (LONG_EDGE, LONG_EDGE))  # JPEG: decode at a smaller scale, far cheaper
    image.load()
    has_alpha = image.mode in ("RGBA", "LA") or "transparency" in image.info
    converted = image.convert("RGBA" if has_alpha else "RGB")
    converted.thumbnail((LONG_EDGE, LONG_EDGE))
    buffer = io.BytesIO()
    if has_alpha:
        converted.save(buffer, format="PNG", optimize=True)
        media_type = "image/png"
    else:
        converted.save(buffer, format="JPEG", quality=85)
        media_type = "image/jpeg"
    data = buffer.getvalue()
    if len(data) > MAX_BYTES:  # pragma: no cover - 1568 px fit far below 5 MB
        raise ImageProblemError("it is too large even scaled down")
    return FittedImage(data, media_type, converted.width, converted.height)
