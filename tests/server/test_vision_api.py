"""Images through the server's OpenAI chat API, on a tiny random SmolVLM: the `openai` client sends a `data:` URL
image and gets the tokens the Engine gives for the same picture; each bad image part is a 400 naming the part,
and the server keeps answering."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import httpx
import pytest
import rsgl
from PIL import Image
from server_helpers import API_KEY, AUTH, openai_client, running_server

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
QUESTION = "What is here?"


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def data_url(payload: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(payload).decode()}"


def picture() -> Image.Image:
    return Image.linear_gradient("L").convert("RGB").resize((48, 40))


def bomb_png(width: int, height: int) -> bytes:
    """A PNG declaring a `width` x `height` image (its data one empty row): only its header is ever read."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


def image_message(*urls: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def vlm_server(smolvlm_folder, tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("vlm-server"), "--model-path", str(smolvlm_folder), "--threads", "1") as (url, _):
        yield url


def test_the_openai_client_sends_a_data_url_image(vlm_server, smolvlm_folder):
    client = openai_client(vlm_server)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=image_message(data_url(png(picture()))), temperature=0, max_tokens=8, extra_body={"ignore_eos": True}
    )
    with rsgl.Engine(str(smolvlm_folder), threads=1, progress=False) as engine:
        expected = engine.chat([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}], GREEDY, image_data=[picture()])
    assert reply.choices[0].message.content == expected["text"]
    assert reply.usage.prompt_tokens == expected["meta_info"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (data_url(png(picture())[:60]), "truncated|broken|cannot"),
        (data_url(b"this is not an image at all"), "not an image|cannot identify|unrecognized"),
        (data_url(bomb_png(100_000, 100_000)), "pixels"),
        ("data:image/png;base64,@@@not base64@@@", "base64"),
        ("data:text/plain;base64,aGVsbG8=", "image"),
        ("https://example.com/cat.png", "--allow-image-urls"),
        ("/etc/hostname", "local|file|base64|image"),
    ],
    ids=["truncated", "not an image", "decompression bomb", "bad base64", "not an image type", "remote without the flag", "local path"],
)
def test_bad_images_are_400s_naming_the_part(vlm_server, url, says):
    with httpx.Client(base_url=vlm_server, headers=AUTH, timeout=60) as http:
        response = http.post("/v1/chat/completions", json={"model": "default", "messages": image_message(data_url(png(picture())), url)})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "messages[0].content[1].image_url"
        assert any(word.lower() in error["message"].lower() for word in says.split("|")), error["message"]
        assert http.get("/health").status_code == 200


def test_too_many_images_and_a_missing_url_are_refused(vlm_server):
    with httpx.Client(base_url=vlm_server, headers=AUTH, timeout=60) as http:
        many = http.post("/v1/chat/completions", json={"model": "default", "messages": image_message(*[data_url(png(picture()))] * 17)})
        assert many.status_code == 400 and "at most 16 images" in many.json()["error"]["message"]
        missing = http.post(
            "/v1/chat/completions", json={"model": "default", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
        )
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages[0].content[0].image_url"


def test_a_text_model_refuses_image_parts(server_url):
    with httpx.Client(base_url=server_url, headers=AUTH, timeout=60) as http:
        response = http.post("/v1/chat/completions", json={"model": "default", "messages": image_message(data_url(png(picture())))})
        assert response.status_code == 400 and "text only" in response.json()["error"]["message"]
        assert response.json()["error"]["param"] == "messages[0].content[0].image_url"


def test_the_anthropic_client_sends_a_base64_image_block(vlm_server):
    import anthropic

    client = anthropic.Anthropic(base_url=vlm_server, api_key=API_KEY, max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png(picture())).decode()}}
    content = [image, {"type": "text", "text": QUESTION}]
    # The newest SDKs send no temperature: the server's Anthropic route reads it from the body where given.
    reply = client.messages.create(model="default", max_tokens=8, messages=[{"role": "user", "content": content}], extra_body={"temperature": 0})
    chat = openai_client(vlm_server).chat.completions.create(model="default", messages=image_message(data_url(png(picture()))), temperature=0, max_tokens=8)
    assert reply.content[0].text == chat.choices[0].message.content
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    bad = {**image, "source": {**image["source"], "media_type": "image/tiff"}}
    with pytest.raises(anthropic.BadRequestError, match="media_type"):
        client.messages.create(model="default", max_tokens=8, messages=[{"role": "user", "content": [bad]}])


def test_sglang_generate_takes_image_data(vlm_server, smolvlm_folder):
    text = "User:<image>" + QUESTION + "<end_of_utterance>\nAssistant:"
    with httpx.Client(base_url=vlm_server, headers=AUTH, timeout=60) as http:
        one = http.post("/generate", json={"text": text, "image_data": data_url(png(picture())), "sampling_params": GREEDY}).json()
        batch = http.post(
            "/generate",
            json={"text": [text, text], "image_data": [[data_url(png(picture()))], base64.b64encode(png(picture())).decode()], "sampling_params": GREEDY},
        ).json()
        assert [b["output_ids"] for b in batch] == [one["output_ids"]] * 2
        with_ids = http.post("/generate", json={"input_ids": [1, 2], "image_data": data_url(png(picture()))})
        assert with_ids.status_code == 400 and with_ids.json()["error"]["param"] == "image_data"
        bad = http.post("/generate", json={"text": [text, text], "image_data": [data_url(png(picture())), "data:image/png;base64,AAAA"]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "image_data[1]"
    with rsgl.Engine(str(smolvlm_folder), threads=1, progress=False) as engine:
        assert one["output_ids"] == engine.generate(text, GREEDY, image_data=[picture()])["output_ids"]
