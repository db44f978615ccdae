"""Images in requests: OpenAI's `image_url` content parts (found in the messages, replaced by the parts chat templates
render as image placeholders) and SGLang's `image_data` of /generate, decoded off the event loop within the server's
limits (`data:` URLs and base64 always; http(s) URLs only with --allow-image-urls, each fetched within a size and a
time limit)."""

from __future__ import annotations

import asyncio
import urllib.request
from dataclasses import dataclass
from typing import Any

from rsgl._typing import JsonObject
from rsgl.errors import InvalidRequestError
from rsgl.server.errors import bad_request
from rsgl.vision.images import ImageLimits, ImageSource, load_image

FETCH_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class RequestImage:
    """An image of a request (a chat image part, an entry of image_data): its URL and where it sits in the request (for errors)."""

    url: str
    param: str


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def image_url(part: JsonObject, param: str) -> RequestImage:
    """An `image_url` part's URL (OpenAI's `{"url": ...}` object, or the bare string some clients send)."""
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise bad_request(f"{param}.image_url must be an object with a url: a data: URL or an http(s) URL", f"{param}.image_url")
    return RequestImage(url, f"{param}.image_url")


def template_part(part: JsonObject) -> JsonObject:
    """A content part as chat templates read it: text, or an image placeholder (`{"type": "image"}`)."""
    return {"type": "image"} if is_image_part(part) else {"type": "text", "text": part["text"]}


def server_image_limits(allow_image_urls: bool) -> ImageLimits:
    return ImageLimits(fetch_remote=fetch_image if allow_image_urls else None)


def fetch_image(url: str) -> bytes:
    """An http(s) URL's body, at most ImageLimits' max_bytes, each read within FETCH_TIMEOUT_SECONDS (its failures
    become the request's 400, naming the part)."""
    limit = ImageLimits.max_bytes
    with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "rsgl"}), timeout=FETCH_TIMEOUT_SECONDS) as response:
        body: bytes = response.read(limit + 1)
    if len(body) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return body


async def load_request_images(images: list[RequestImage], limits: ImageLimits) -> list[ImageSource]:
    """The images decoded on a worker thread; a bad one is a 400 naming its part."""

    def load_all() -> list[ImageSource]:
        loaded: list[ImageSource] = []
        for image in images:
            try:
                loaded.append(load_image(image.url, part=image.param, limits=limits))
            except InvalidRequestError as error:
                raise bad_request(str(error), image.param) from None
        return loaded

    return await asyncio.to_thread(load_all)


def generate_images(image_data: Any, prompts: int | None) -> list[list[RequestImage]]:
    """SGLang's `image_data` of /generate, per prompt: for one prompt (`prompts` None) an image or a list of them;
    for a batch, per prompt an image or a list of them."""

    def images(value: Any, param: str) -> list[RequestImage]:
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(item, str) and item for item in items):
            raise bad_request(f"{param} must be an image (a data URL, base64 text or an http(s) URL) or a list of them", param)
        return [RequestImage(item, f"{param}[{i}]" if isinstance(value, list) else param) for i, item in enumerate(items)]

    if prompts is None:
        return [images(image_data, "image_data")]
    if not isinstance(image_data, list) or len(image_data) != prompts:
        raise bad_request(f"image_data must hold the images of each of the {prompts} prompts", "image_data")
    return [images(value, f"image_data[{i}]") for i, value in enumerate(image_data)]
