"""Image input: rsgl.vision.images (decoding a request's image, within limits) and rsgl.vision.smolvlm (SmolVLM's
tiles and prompt expansion), against transformers' own SmolVLMImageProcessorPil, Idefics3Processor and image utils."""

import base64
import io
import json
import re
import struct
import warnings
import zlib

import numpy as np
import pytest
import transformers
from PIL import Image
from rsgl._core import Tokenizer
from rsgl.errors import InvalidRequestError, ModelLoadError
from rsgl.vision.images import ImageLimits, image_hash, load_image, to_rgb
from rsgl.vision.pixels import PixelSteps
from rsgl.vision.smolvlm import FAKE_IMAGE_TOKEN, GLOBAL_IMAGE_TOKEN, IMAGE_TOKEN, SmolVLMImages
from transformers.image_transforms import convert_to_rgb
from transformers.image_utils import load_image as transformers_load_image
from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string
from vision_models import LONGEST_EDGE, TILE, TOKENS_PER_TILE, build_tiny_smolvlm

PART = "messages[0].content[1].image_url"
PART_PATTERN = re.escape(PART)
LIMITS = ImageLimits()

# (height, width): square, 3:1 landscape, portrait, smaller than a tile, odd, one tile exactly, just over a tile,
# slivers whose short edge rounds to 0 or 1, larger than the longest edge (scaled down).
SIZES = [(64, 64), (40, 120), (150, 50), (20, 20), (37, 91), (91, 37), (32, 32), (33, 31), (1, 1), (1, 200), (200, 3), (5000, 7), (300, 200), (129, 43)]
MODES = ["RGB", "RGBA", "L", "LA", "P", "P+transparency", "RGB+transparency"]


def picture(height: int, width: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """Gradients plus noise (so every resize filter tap matters), in `mode`; "+transparency" adds a transparent
    colour (a palette index, or an RGB colour the picture uses) instead of an alpha band."""
    rng = np.random.default_rng(seed + height * 7919 + width)
    y, x = np.mgrid[0:height, 0:width]
    channels = [(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)), ((x + y) * 3) % 256, rng.integers(0, 256, (height, width))]
    pixels = np.clip(np.stack(channels, axis=-1) + rng.integers(-40, 41, (height, width, 4)), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGBA")
    base_mode, _, transparency = mode.partition("+")
    # Other modes from the RGB picture: a palette converted from RGBA would keep per-entry alpha, a transparency of its own.
    image = image.convert(base_mode) if base_mode in ("RGBA", "LA") else image.convert("RGB").convert(base_mode)
    if transparency:
        image.info["transparency"] = 3 if base_mode == "P" else tuple(int(v) for v in np.asarray(image)[0, 0])
    return image


def encoded(image: Image.Image, format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def reference(smolvlm_folder):
    """transformers' processor for the folder, with the PIL image processor (the one rsgl matches)."""
    processor = transformers.AutoProcessor.from_pretrained(smolvlm_folder)
    assert isinstance(processor.image_processor, transformers.SmolVLMImageProcessorPil)
    return processor


def assert_same_tiles(images: SmolVLMImages, image_processor, image: Image.Image) -> None:
    pixel_values, rows, cols = images.preprocess(image)
    expected = image_processor(images=[[image]], return_tensors="np", return_row_col_info=True)
    assert pixel_values.dtype == np.float32 and pixel_values.flags.c_contiguous
    np.testing.assert_array_equal(pixel_values, expected["pixel_values"][0])
    assert (rows, cols) == (expected["rows"][0][0], expected["cols"][0][0])
    # One image's tiles need no padding: transformers' mask is all ones, which is why rsgl has none.
    assert expected["pixel_attention_mask"].all()
    assert len(pixel_values) == (rows * cols + 1 if rows else 1)


def test_folder_settings(smolvlm_folder):
    images = SmolVLMImages.from_folder(smolvlm_folder)
    assert (images.tile_size, images.longest_edge, images.image_seq_len, images.split) == (TILE, LONGEST_EDGE, TOKENS_PER_TILE, True)
    assert images.pixel_steps == PixelSteps(Image.Resampling.LANCZOS, 1 / 255, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("height, width", SIZES)
def test_preprocess_equals_transformers(smolvlm_folder, reference, height, width, mode):
    assert_same_tiles(SmolVLMImages.from_folder(smolvlm_folder), reference.image_processor, picture(height, width, mode))


def test_preprocess_random_sizes(smolvlm_folder, reference):
    """Sizes where transformers' float truncations (aspect ratios, rounding to even and to tiles) decide an edge."""
    images = SmolVLMImages.from_folder(smolvlm_folder)
    rng = np.random.default_rng(7)
    for height, width in rng.integers(1, 400, (60, 2)):
        assert_same_tiles(images, reference.image_processor, picture(int(height), int(width)))


@pytest.mark.parametrize(
    "settings",
    [
        # No splitting: one tile. Bicubic, ImageNet's mean and std, scalar mean/std.
        {"do_image_splitting": False},
        {"resample": 3, "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]},
        {"image_mean": 0.25, "image_std": 0.75, "size": {"longest_edge": 3 * TILE}},
        # No first resize; no rescale or normalization; a fixed first size.
        {"do_resize": False},
        {"do_rescale": False, "do_normalize": False},
        {"size": {"height": 50, "width": 70}},
    ],
)
def test_other_settings_legacy_layout(tmp_path, settings):
    """A Hub folder's layout (preprocessor_config.json, image_seq_len in processor_config.json), other settings."""
    image_processor = transformers.SmolVLMImageProcessorPil(**{"size": {"longest_edge": LONGEST_EDGE}, "max_image_size": {"longest_edge": TILE}, **settings})
    image_processor.save_pretrained(tmp_path)
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_seq_len": 9, "processor_class": "Idefics3Processor"}))
    images = SmolVLMImages.from_folder(tmp_path)
    assert images.image_seq_len == 9
    # (24, 70) unresized: its height scaled to the 96-pixel width is 32.9, which transformers truncates to one tile.
    for height, width in [(64, 64), (37, 91), (150, 50), (20, 20), (100, 33), (24, 70)]:
        assert_same_tiles(images, image_processor, picture(height, width, "RGBA"))


def test_smolvlm_256m_settings(tmp_path):
    """SmolVLM-256M-Instruct's numbers (module docstring): 512-pixel tiles, longest edge 2048, 64 tokens per tile."""
    settings = {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}, "resample": 1}
    image_processor = transformers.Idefics3ImageProcessorPil(**settings)
    image_processor.save_pretrained(tmp_path)
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_seq_len": 64}))
    config = transformers.Idefics3Config(vision_config={"image_size": 512, "patch_size": 16}, scale_factor=4)
    (tmp_path / "config.json").write_text(config.to_json_string(use_diff=False))
    images = SmolVLMImages.from_folder(tmp_path)
    for (height, width), (rows, cols) in {(480, 640): (3, 4), (100, 100): (4, 4), (512, 1536): (2, 4)}.items():
        pixel_values, *rows_cols = images.preprocess(picture(height, width))
        assert rows_cols == [rows, cols] and pixel_values.shape == (rows * cols + 1, 3, 512, 512)
    assert_same_tiles(images, image_processor, picture(480, 640, "RGBA"))


def test_tokens_per_tile_checked_against_the_model(tmp_path):
    build_tiny_smolvlm(tmp_path, model_type="idefics3")
    assert SmolVLMImages.from_folder(tmp_path).image_seq_len == TOKENS_PER_TILE
    processor_config = json.loads((tmp_path / "processor_config.json").read_text())
    (tmp_path / "processor_config.json").write_text(json.dumps({**processor_config, "image_seq_len": TOKENS_PER_TILE + 1}))
    with pytest.raises(ModelLoadError, match="makes 4 of a 32-pixel tile"):
        SmolVLMImages.from_folder(tmp_path)
    (tmp_path / "processor_config.json").unlink()
    with pytest.raises(ModelLoadError, match="no image processor settings"):
        SmolVLMImages.from_folder(tmp_path)


@pytest.mark.parametrize("rows, cols", [(0, 0), (1, 2), (2, 1), (3, 4), (4, 4), (6, 6)])
def test_image_prompt_equals_smolvlm_processor(smolvlm_folder, rows, cols):
    expected = get_image_prompt_string(rows, cols, TOKENS_PER_TILE, FAKE_IMAGE_TOKEN, IMAGE_TOKEN, GLOBAL_IMAGE_TOKEN)
    assert SmolVLMImages.from_folder(smolvlm_folder).image_prompt(rows, cols) == expected


@pytest.mark.parametrize(
    "prompt, sizes",
    [
        ("<|im_start|>User:<image>Describe it.<end_of_utterance>\nAssistant:", [(40, 120)]),
        ("<image>small <image> and odd <image>", [(20, 20), (64, 64), (37, 91)]),
        ("Compare<image>\n<image><end_of_utterance>\nAssistant:", [(150, 50), (32, 32)]),
    ],
)
def test_expand_equals_processor(smolvlm_folder, reference, prompt, sizes):
    """Token ids of the expanded prompt (transformers' tokenizer and rsgl's) equal the processor's input_ids, and its
    pixel values the tiles of every image in order."""
    images = SmolVLMImages.from_folder(smolvlm_folder)
    pictures = [picture(height, width, "RGBA", seed=i) for i, (height, width) in enumerate(sizes)]
    tiles = [images.preprocess(image) for image in pictures]
    text = images.expand(prompt, [(rows, cols) for _, rows, cols in tiles])
    expected = reference(text=prompt, images=pictures)
    assert text.count(IMAGE_TOKEN) == TOKENS_PER_TILE * sum(rows * cols + 1 for _, rows, cols in tiles)
    assert reference.tokenizer(text)["input_ids"] == expected["input_ids"][0]
    rsgl_tokenizer = Tokenizer.from_str((smolvlm_folder / "tokenizer.json").read_text())
    assert rsgl_tokenizer.encode(text) == expected["input_ids"][0]
    np.testing.assert_array_equal(np.concatenate([pixel_values for pixel_values, _, _ in tiles]), expected["pixel_values"][0])


def test_expand_counts_placeholders(smolvlm_folder):
    images = SmolVLMImages.from_folder(smolvlm_folder)
    with pytest.raises(InvalidRequestError, match="2 <image> placeholders for 1 images"):
        images.expand("<image><image>", [(0, 0)])
    assert images.expand("no images", []) == "no images"


# ---- decoding a request's image


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "P+transparency", "RGB+transparency"])
def test_rgb_as_transformers_converts(mode):
    """Transparency is composited onto white, as transformers' convert_to_rgb does, through a PNG round trip too."""
    image = picture(23, 17, mode)
    expected = convert_to_rgb(image, return_numpy=True)
    np.testing.assert_array_equal(np.asarray(to_rgb(image)), expected)
    loaded = load_image(encoded(image, "PNG"), part=PART, limits=LIMITS)
    assert loaded.mode == "RGB"
    np.testing.assert_array_equal(np.asarray(loaded), expected)


def test_sources():
    image = picture(30, 20)
    png = encoded(image, "PNG")
    jpeg = encoded(image, "JPEG", quality=90)
    expected = np.asarray(image)
    as_base64 = base64.b64encode(png).decode()
    for source in [png, f"data:image/png;base64,{as_base64}", f"DATA:image/jpeg; base64 ,{as_base64}", as_base64, base64.encodebytes(png).decode(), image]:
        np.testing.assert_array_equal(np.asarray(load_image(source, part=PART, limits=LIMITS)), expected)
    # A JPEG's base64 starts with "/9j/", which must not be taken for a path.
    jpeg_base64 = base64.b64encode(jpeg).decode()
    assert jpeg_base64.startswith("/9j/")
    np.testing.assert_array_equal(np.asarray(load_image(jpeg_base64, part=PART, limits=LIMITS)), np.asarray(Image.open(io.BytesIO(jpeg))))


def test_exif_orientation_as_transformers_load_image():
    image = picture(20, 36)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: the picture is shown turned 90 degrees clockwise
    jpeg = encoded(image, "JPEG", exif=exif, quality=95)
    loaded = load_image(jpeg, part=PART, limits=LIMITS)
    assert loaded.size == (20, 36)
    np.testing.assert_array_equal(np.asarray(loaded), np.asarray(transformers_load_image(base64.b64encode(jpeg).decode())))


def test_local_files_and_remote_urls(tmp_path):
    image = picture(16, 16)
    path = tmp_path / "cat.png"
    path.write_bytes(encoded(image, "PNG"))
    for source in [str(path), path.as_uri()]:
        with pytest.raises(InvalidRequestError, match=rf"^{PART_PATTERN}: this server does not read local image files"):
            load_image(source, part=PART, limits=LIMITS)
        allowed = ImageLimits(allow_local_files=True)
        np.testing.assert_array_equal(np.asarray(load_image(source, part=PART, limits=allowed)), np.asarray(image))
    with pytest.raises(InvalidRequestError, match=rf"^{PART_PATTERN}: no image file at"):
        load_image(str(tmp_path / "missing.png"), part=PART, limits=ImageLimits(allow_local_files=True))

    url = "https://example.com/cat.png"
    with pytest.raises(InvalidRequestError, match=rf"^{PART_PATTERN}: remote image URLs need a server started with --allow-image-urls"):
        load_image(url, part=PART, limits=LIMITS)
    fetched = load_image(url, part=PART, limits=ImageLimits(fetch_remote=lambda _: path.read_bytes()))
    np.testing.assert_array_equal(np.asarray(fetched), np.asarray(image))

    def unreachable(url: str) -> bytes:
        raise OSError("connection refused")

    with pytest.raises(InvalidRequestError, match=rf"^{PART_PATTERN}: cannot fetch the image at {url} \(connection refused\)"):
        load_image(url, part=PART, limits=ImageLimits(fetch_remote=unreachable))
    with pytest.raises(InvalidRequestError, match=rf"^{PART_PATTERN}: unsupported image URL scheme"):
        load_image("s3://bucket/cat.png", part=PART, limits=LIMITS)


def png_declaring(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header (IHDR, its CRC fixed) declares width x height pixels: a decompression bomb's header."""
    png = bytearray(encoded(Image.new("RGB", (1, 1)), "PNG"))
    assert png[12:16] == b"IHDR"
    png[16:24] = struct.pack(">II", width, height)
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))
    return bytes(png)


def bad_inputs():
    noise = picture(64, 64)
    png, jpeg = encoded(noise, "PNG"), encoded(noise, "JPEG", quality=95)
    ppm = encoded(noise, "PPM")
    return {
        "truncated PNG": (png[: len(png) // 2], "the PNG image is truncated or corrupt"),
        "truncated JPEG": (jpeg[: len(jpeg) // 2], "the JPEG image is truncated or corrupt"),
        "random bytes": (np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes(), "not an image in a supported format"),
        "empty": (b"", "the image is empty"),
        "a format left out (PPM)": (ppm, "not an image in a supported format"),
        "a header over max_pixels": (png_declaring(9000, 9000), r"the image is 9000x9000 \(81000000 pixels\), more than the 64000000 allowed"),
        "a header over PIL's own limit": (png_declaring(100_000, 100_000), "the image is too large to decode"),
        "bad base64": ("not base64 at all!", "neither a URL, a data URL nor valid base64"),
        "bad base64 in a data URL": ("data:image/png;base64,@@@@", "the data URL's data is not valid base64"),
        "a data URL that is not an image": (f"data:text/plain;base64,{base64.b64encode(png).decode()}", "the data URL holds text/plain, not an image"),
        "a data URL without base64": ("data:image/png,%89PNG", "the data URL is not base64-encoded"),
        "a data URL without data": ("data:image/png;base64", "malformed data URL"),
        "a number": (12, "not as int"),
        "an empty PIL image": (Image.new("RGB", (0, 0)), r"the image is empty \(0x0\)"),
    }


@pytest.mark.parametrize("name", list(bad_inputs()))
def test_bad_inputs(name):
    source, message = bad_inputs()[name]
    with pytest.raises(InvalidRequestError, match=rf"^{PART_PATTERN}: .*{message}"):
        load_image(source, part=PART, limits=LIMITS)


def test_pixel_and_byte_limits():
    max_image_pixels = Image.MAX_IMAGE_PIXELS
    png = encoded(picture(20, 20), "PNG")
    with pytest.raises(InvalidRequestError, match=r"20x20 \(400 pixels\), more than the 399 allowed"):
        load_image(png, part=PART, limits=ImageLimits(max_pixels=399))
    small = ImageLimits(max_bytes=len(png) - 1)
    for source in [png, base64.b64encode(png).decode(), f"data:image/png;base64,{base64.b64encode(png).decode()}"]:
        with pytest.raises(InvalidRequestError, match=rf"^{PART_PATTERN}: the image is .*than the {len(png) - 1}"):
            load_image(source, part=PART, limits=small)
    assert load_image(png, part=PART, limits=ImageLimits(max_bytes=len(png), max_pixels=400)).size == (20, 20)
    # Between PIL's warning and error thresholds, with warnings as errors: still InvalidRequestError.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidRequestError, match="too large to decode"):
            load_image(png_declaring(10_000, 10_000), part=PART, limits=ImageLimits(max_pixels=10**9))
    assert Image.MAX_IMAGE_PIXELS == max_image_pixels


def test_image_hash():
    """A picture hashes alike in every lossless format (BMP keeps no alpha, so the RGBA one skips it)."""
    for mode, formats in [("RGB", ["WEBP", "BMP", "TIFF"]), ("RGBA", ["WEBP", "TIFF"])]:
        image = picture(21, 34, mode)
        rgb = load_image(encoded(image, "PNG"), part=PART, limits=LIMITS)
        digest = image_hash(rgb)
        assert len(digest) == 32
        assert image_hash(image) == digest  # hashed as its RGB
        for format in formats:
            assert image_hash(load_image(encoded(image, format, lossless=True), part=PART, limits=LIMITS)) == digest, format
    changed = rgb.copy()
    changed.putpixel((5, 5), tuple((value + 1) % 256 for value in changed.getpixel((5, 5))))
    assert image_hash(changed) != digest
    # The same pixel bytes in another shape.
    pixels = np.asarray(picture(4, 6))
    shapes = [Image.fromarray(pixels.reshape(shape)) for shape in [(4, 6, 3), (6, 4, 3), (3, 8, 3), (2, 12, 3)]]
    assert len({image_hash(shape) for shape in shapes}) == 4
