"""A request's image turned into an RGB `PIL.Image.Image`, or an InvalidRequestError that names the request part.

`load_image` takes raw bytes; a `data:image/...;base64,...` URL; bare base64 text (SGLang's `image_data`); a local
file path or `file://` URL (only with `ImageLimits.allow_local_files`); an http(s) URL (only with
`ImageLimits.fetch_remote`, which fetches it); or an open PIL image.

The bytes are untrusted, so decoding is defensive: only the formats browsers and cameras produce are opened (PIL's
other plugins include EPS, which runs Ghostscript), the size an image declares is checked against `max_pixels`
before any pixel is decoded, and every decoder failure becomes InvalidRequestError.

Colour is what transformers' image processors make of an image (`convert_to_rgb`, do_convert_rgb=True): an image
with transparency (an alpha band, or a palette, grayscale or RGB image with a transparent colour) is composited onto
white, any other is converted by PIL. The EXIF orientation is applied first, as transformers' `load_image` does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import re
import struct
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from PIL import ExifTags, Image, ImageOps

from rsgl.errors import InvalidRequestError

ImageSource: TypeAlias = bytes | str | Image.Image

# JPEG covers MPO too (phones' multi-picture JPEGs open through the JPEG plugin).
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF", "AVIF")

_URL_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://")
_PATH_PREFIXES = ("/", "./", "../", "~", "\\")


@dataclass(frozen=True)
class ImageLimits:
    """What `load_image` accepts."""

    # 64 MP admits an 8K frame (33 MP) and a 50 MP phone photo, keeps one decoded RGB image under 200 MB, and sits
    # below PIL's own warning threshold (Image.MAX_IMAGE_PIXELS, 89 MP), so an image this limit admits never warns.
    max_pixels: int = 64_000_000
    # The encoded file (after base64 decoding), checked before decoding: a 50 MP JPEG fits.
    max_bytes: int = 20 * 1024 * 1024
    allow_local_files: bool = False
    # Fetches an http(s) URL's bytes (the server's, when it allows image URLs); None refuses remote URLs.
    fetch_remote: Callable[[str], bytes] | None = None


def load_image(source: ImageSource, *, part: str, limits: ImageLimits) -> Image.Image:
    """`source` decoded to an RGB image (`source` itself if it is an upright RGB image); InvalidRequestError (its message starting with `part`, the request part
    the image came in, e.g. "messages[0].content[1].image_url") for anything that is no image within `limits`."""
    if isinstance(source, Image.Image):
        return _upright_rgb(source, part, limits)
    if isinstance(source, bytes):
        return _decode(source, part, limits)
    if isinstance(source, str):
        return _decode(_payload(source, part, limits), part, limits)
    raise InvalidRequestError(f"{part}: an image is given as a URL, a data URL or base64 text, not as {type(source).__name__}")


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` in RGB, any transparency composited onto white (transformers' `convert_to_rgb`); an RGB image
    without transparency is returned as is."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def image_hash(image: Image.Image) -> bytes:
    """The sha256 (32 bytes) of a picture: its size and its RGB pixels. A picture hashes alike whatever lossless
    format carried it; different pictures, the same pixel bytes in another shape included, hash apart."""
    rgb = to_rgb(image)
    digest = hashlib.sha256(struct.pack("<II", rgb.width, rgb.height))
    digest.update(rgb.tobytes())
    return digest.digest()


def _payload(text: str, part: str, limits: ImageLimits) -> bytes:
    """The encoded image a string names or holds."""
    head = text[:8].lower()
    if head.startswith(("http://", "https://")):
        return _fetch(text, part, limits)
    if head.startswith("data:"):
        return _data_url_payload(text, part, limits)
    if head.startswith("file://"):
        return _read_file(urllib.request.url2pathname(urllib.parse.urlsplit(text).path), part, limits)
    # A path wins over base64, as in transformers' load_image; the check is skipped when files may not be read,
    # so a client cannot probe which files exist.
    if limits.allow_local_files and os.path.isfile(text):
        return _read_file(text, part, limits)
    if _URL_SCHEME.match(text):
        raise InvalidRequestError(f"{part}: unsupported image URL scheme in {_shorten(text)}; use http(s) or a data URL")
    payload = _base64_payload(text, part, limits)
    if payload is not None:
        return payload
    # Checked after base64, which a JPEG's base64 ("/9j/...") would otherwise look like a path to.
    if text.startswith(_PATH_PREFIXES):
        if limits.allow_local_files:
            raise InvalidRequestError(f"{part}: no image file at {_shorten(text)}")
        raise InvalidRequestError(f"{part}: this server does not read local image files; send the image inline as a data URL (data:image/png;base64,...)")
    raise InvalidRequestError(f"{part}: the image is neither a URL, a data URL nor valid base64 text")


def _fetch(url: str, part: str, limits: ImageLimits) -> bytes:
    if limits.fetch_remote is None:
        raise InvalidRequestError(
            f"{part}: remote image URLs need a server started with --allow-image-urls; send the image inline as a data URL (data:image/png;base64,...)"
        )
    try:
        return limits.fetch_remote(url)
    except InvalidRequestError:
        raise
    except Exception as error:  # the fetcher's own failures (network, HTTP status) are the request's
        raise InvalidRequestError(f"{part}: cannot fetch the image at {_shorten(url)} ({error})") from error


def _data_url_payload(url: str, part: str, limits: ImageLimits) -> bytes:
    header, comma, data = url.partition(",")
    if not comma:
        raise InvalidRequestError(f"{part}: malformed data URL (no comma before the data); expected data:image/png;base64,...")
    media_type, *parameters = (field.strip().lower() for field in header[len("data:") :].split(";"))
    if not media_type.startswith("image/"):
        raise InvalidRequestError(f"{part}: the data URL holds {media_type or 'text/plain'}, not an image; expected data:image/...;base64,...")
    if "base64" not in parameters:
        raise InvalidRequestError(f"{part}: the data URL is not base64-encoded; expected data:{media_type};base64,...")
    payload = _base64_payload(data, part, limits)
    if payload is None:
        raise InvalidRequestError(f"{part}: the data URL's data is not valid base64")
    return payload


def _base64_payload(text: str, part: str, limits: ImageLimits) -> bytes | None:
    """The bytes strict base64 `text` encodes (whitespace, as in MIME line breaks, ignored); None if it is not base64."""
    compact = "".join(text.split())
    if len(compact) // 4 * 3 > limits.max_bytes:
        raise InvalidRequestError(f"{part}: the image is about {len(compact) // 4 * 3} bytes, more than the {limits.max_bytes} allowed")
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):  # ValueError: text that is not ASCII
        return None


def _read_file(path: str, part: str, limits: ImageLimits) -> bytes:
    if not limits.allow_local_files:
        raise InvalidRequestError(f"{part}: this server does not read local image files; send the image inline as a data URL (data:image/png;base64,...)")
    if not os.path.isfile(path):
        raise InvalidRequestError(f"{part}: no image file at {_shorten(path)}")
    try:
        with open(path, "rb") as file:
            return file.read(limits.max_bytes + 1)  # one byte more than allowed: enough to tell it is too large
    except OSError as error:
        raise InvalidRequestError(f"{part}: cannot read the image file {_shorten(path)} ({error.strerror or error})") from error


def _decode(payload: bytes, part: str, limits: ImageLimits) -> Image.Image:
    if len(payload) > limits.max_bytes:
        raise InvalidRequestError(f"{part}: the image is larger than the {limits.max_bytes} bytes allowed")
    if not payload:
        raise InvalidRequestError(f"{part}: the image is empty")
    try:
        # Reads the header only; pixels are decoded by load().
        image = Image.open(io.BytesIO(payload), formats=IMAGE_FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        # PIL's own limits (its warning is raised when warnings are errors); PIL's globals are left alone.
        raise InvalidRequestError(f"{part}: the image is too large to decode ({error}); at most {limits.max_pixels} pixels are allowed") from error
    except Exception as error:  # UnidentifiedImageError, or whatever a format's header parser raises on garbage
        raise InvalidRequestError(f"{part}: the data is not an image in a supported format ({', '.join(IMAGE_FORMATS)})") from error
    return _upright_rgb(image, part, limits)


def _upright_rgb(image: Image.Image, part: str, limits: ImageLimits) -> Image.Image:
    """`image` (opened, maybe not decoded yet) checked against the limits, decoded, turned upright and to RGB."""
    width, height = image.size
    if width * height > limits.max_pixels:
        raise InvalidRequestError(f"{part}: the image is {width}x{height} ({width * height} pixels), more than the {limits.max_pixels} allowed")
    if width == 0 or height == 0:
        raise InvalidRequestError(f"{part}: the image is empty ({width}x{height})")
    try:
        image.load()
        if image.getexif().get(ExifTags.Base.Orientation, 1) != 1:
            image = ImageOps.exif_transpose(image)
        return to_rgb(image)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise InvalidRequestError(f"{part}: the image is too large to decode ({error}); at most {limits.max_pixels} pixels are allowed") from error
    except Exception as error:  # truncated or corrupt data: PIL's decoders raise OSError, ValueError, SyntaxError...
        kind = f"{image.format} image" if image.format else "image"
        raise InvalidRequestError(f"{part}: the {kind} is truncated or corrupt ({error})") from error


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
