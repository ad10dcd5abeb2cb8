"""Images in the token-first contract: untrusted images decoded under limits, the model's processor as runners use it,
and the multimodal inputs that travel with a trajectory.

A vision model's runner (and session server) is handed the model's ``AutoProcessor`` where a text model's is handed
its tokenizer. ``VisionCodec`` wraps it: text goes through the processor's tokenizer exactly as for a text model,
and a piece of context holding images goes through the processor itself, which expands each placeholder the chat
template wrote (the processor's ``image_token``: nothing here names a model's tokens) into the exact ids the model
reads, and returns the image tensors (``pixel_values``, ``image_grid_thw``, ... : what the image processor names).
Those tensors are kept as ``VisionInputs``, aligned with the placeholders in the ids, and are what the engine
generates with and the trainer's forward consumes: nothing is re-processed after generation.

Images arrive as PIL images, encoded bytes, base64 strings or ``data:`` URIs; a remote URL is refused (nothing is
fetched). A corrupt, oversized or over-numerous image is an ``ImageError`` naming it. Importing this module imports
neither torch nor transformers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

MAX_IMAGES = 8  # per context (prompt + every later turn), unless the codec is given another limit
MAX_IMAGE_BYTES = 8 * 1024 * 1024  # encoded
MAX_IMAGE_PIXELS = 4096 * 4096  # decoded width x height
_DATA_URI = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)$", re.DOTALL)


class ImageError(ValueError):
    """Raised when an image cannot be decoded, exceeds a size or count limit, or meets a model that reads no images."""


def load_image(
    value: Any, where: str = "image", *, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS
) -> Any:
    """An RGB ``PIL.Image`` from a PIL image, encoded bytes, a base64 string or a ``data:`` URI.

    Args:
        value: the image.
        where: what to call it in an error ("messages[0].content[1]").
        max_bytes: the largest encoded size accepted.
        max_pixels: the largest width x height accepted (checked from the header, before decoding).

    Returns:
        The decoded image, converted to RGB.

    Raises:
        ImageError: a remote URL, undecodable data, or an image over a limit.
    """
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        image = value
    else:
        data = _image_bytes(value, where, max_bytes)
        try:
            image = Image.open(io.BytesIO(data))
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise ImageError(f"{where} is not a decodable image ({exc}); send PNG, JPEG, GIF or WebP bytes") from None
    width, height = image.size
    if width < 1 or height < 1 or width * height > max_pixels:
        raise ImageError(
            f"{where} is {width}x{height} pixels; the limit is {max_pixels} pixels (width x height): downscale it"
        )
    try:
        image.load()
        return image if image.mode == "RGB" else image.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ImageError(f"{where} is a corrupt image ({type(exc).__name__}: {exc})") from None


def _image_bytes(value: Any, where: str, max_bytes: int) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    elif isinstance(value, str):
        text = value.strip()
        if re.match(r"^[a-z][a-z0-9+.-]*://", text, re.IGNORECASE):
            raise ImageError(
                f"{where} is a remote URL ({text[:80]!r}); images are never fetched: send the image itself, as a "
                "base64 data: URI (data:image/png;base64,...)"
            )
        match = _DATA_URI.match(text)
        if text.startswith("data:") and match is None:
            raise ImageError(f"{where} is a data: URI without ';base64,'; send data:image/png;base64,<data>")
        encoded = match.group("data") if match else text
        if len(encoded) * 3 // 4 > max_bytes:
            raise ImageError(f"{where} is over {max_bytes} bytes encoded; send a smaller image")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ImageError(f"{where} is neither an image nor valid base64 image data") from None
    else:
        raise ImageError(
            f"{where} must be a PIL image, encoded bytes, a base64 string or a data: URI, got {type(value).__name__}"
        )
    if len(data) > max_bytes:
        raise ImageError(f"{where} is {len(data)} bytes encoded; the limit is {max_bytes}")
    return data


def image_digest(image: Any) -> str:
    """A content hash of a decoded image (mode, size and pixels), so equal images compare equal cheaply."""
    digest = hashlib.sha256(f"{image.mode}:{image.size}:".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


@dataclass
class VisionInputs:
    """The processor's image tensors of one context, aligned with the image placeholders in its token ids.

    ``images[k]`` is the k-th image whose placeholders appear in the ids; ``tensors`` holds what the image processor
    returned for all of them (``pixel_values``, and ``image_grid_thw`` or the model's equivalent), concatenated along
    dimension 0 in that order, which is the order the model's forward consumes them in.
    """

    images: list[Any] = field(default_factory=list)
    tensors: dict[str, Any] = field(default_factory=dict)
    token_id: int = -1  # the placeholder token the processor expanded
    token_counts: list[int] = field(default_factory=list)  # placeholder tokens of each image, in order

    def __add__(self, other: VisionInputs | None) -> VisionInputs:
        if other is None or not other.images:
            return self
        if not self.images:
            return other
        import torch

        if set(self.tensors) != set(other.tensors):
            raise ValueError(f"image tensors {sorted(self.tensors)} and {sorted(other.tensors)} cannot be joined")
        return VisionInputs(
            self.images + other.images,
            {k: torch.cat([v, other.tensors[k]]) for k, v in self.tensors.items()},
            self.token_id,
            self.token_counts + other.token_counts,
        )

    def collapse(self, token_ids: list[int]) -> list[int]:
        """``token_ids`` with each image's run of placeholders folded back to one placeholder (what an engine that
        expands placeholders itself, such as vLLM, takes alongside the images).

        Raises:
            ValueError: the ids do not hold exactly these images' placeholders.
        """
        out, i, k = [], 0, 0
        while i < len(token_ids):
            if token_ids[i] != self.token_id:
                out.append(token_ids[i])
                i += 1
                continue
            if (
                k >= len(self.token_counts)
                or token_ids[i : i + self.token_counts[k]] != [self.token_id] * self.token_counts[k]
            ):
                raise ValueError(f"the token ids hold other image placeholders than the {len(self)} image(s) given")
            out.append(self.token_id)
            i, k = i + self.token_counts[k], k + 1
        if k != len(self.token_counts):
            raise ValueError(f"the token ids place {k} of the {len(self)} image(s) given")
        return out

    def __len__(self) -> int:
        return len(self.images)


class VisionCodec:
    """A vision model's processor as runners and the session server use it.

    Args:
        processor: the model's ``AutoProcessor`` (an image processor, a tokenizer and a chat template).
        max_images: images one context may hold at most.
    """

    def __init__(self, processor: Any, max_images: int = MAX_IMAGES) -> None:
        self.processor = processor
        self.tokenizer = processor.tokenizer
        if not getattr(self.tokenizer, "chat_template", None) and getattr(processor, "chat_template", None):
            self.tokenizer.chat_template = processor.chat_template  # the model's template, where the processor holds it
        token = getattr(processor, "image_token", None) or getattr(self.tokenizer, "image_token", None)
        if not isinstance(token, str):
            raise ValueError(f"processor {type(processor).__name__} names no image_token; it cannot place images")
        self.image_token = token
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(token)
        self.tensor_names = list(getattr(processor.image_processor, "model_input_names", None) or ["pixel_values"])
        self.max_images = max_images

    def encode(self, text: str, images: list[Any]) -> tuple[list[int], VisionInputs | None]:
        """Token ids of ``text`` with each image placeholder expanded, and the images' tensors (None: no images).

        Raises:
            ImageError: the text's placeholders and the images do not pair up, or the processor refuses an image.
        """
        if not images:
            return list(self.tokenizer.encode(text, add_special_tokens=False)), None
        placed = text.count(self.image_token)
        if placed != len(images):
            raise ImageError(
                f"the context places {placed} image(s) ({self.image_token!r} in the rendered text) but {len(images)} "
                "image(s) came with it; each image needs one image part in the messages"
            )
        try:
            out = self.processor(text=[text], images=list(images), return_tensors="pt", add_special_tokens=False)
        except (ValueError, TypeError, OSError) as exc:
            raise ImageError(f"the model's processor refused the images: {exc}") from None
        tensors = {name: out[name] for name in self.tensor_names if name in out}
        ids = out["input_ids"][0].tolist()
        return ids, VisionInputs(list(images), tensors, self.image_token_id, self._counts(ids, len(images)))

    def _counts(self, ids: list[int], images: int) -> list[int]:
        """Each image's number of placeholder tokens: its run of them (runs of adjacent images split evenly)."""
        runs, run = [], 0
        for token in [*ids, None]:
            if token == self.image_token_id:
                run += 1
            elif run:
                runs, run = [*runs, run], 0
        if len(runs) == images:
            return runs
        total = sum(runs)
        if total % images == 0 and all(r % (total // images) == 0 for r in runs):
            return [total // images] * images
        raise ImageError(f"the processor's placeholders ({runs}) cannot be told apart into {images} image(s)")


_CODECS: weakref.WeakKeyDictionary[Any, VisionCodec] = weakref.WeakKeyDictionary()


def vision_codec(tokenizer: Any) -> VisionCodec | None:
    """The codec of a processor (one per processor object), or None for a text model's tokenizer."""
    if getattr(tokenizer, "image_processor", None) is None or getattr(tokenizer, "tokenizer", None) is None:
        return None
    codec = _CODECS.get(tokenizer)
    if codec is None:
        codec = _CODECS[tokenizer] = VisionCodec(tokenizer)
    return codec


def text_tokenizer(tokenizer: Any) -> Any:
    """The tokenizer of a processor, or the tokenizer itself."""
    return tokenizer.tokenizer if getattr(tokenizer, "image_processor", None) is not None else tokenizer


def require_codec(tokenizer: Any, count: int) -> VisionCodec:
    """The processor's codec for a context of ``count`` images.

    Raises:
        ImageError: the model reads no images, or ``count`` exceeds the codec's limit.
    """
    codec = vision_codec(tokenizer)
    if codec is None:
        raise ImageError(
            f"{count} image(s) came with this episode but the model is text-only (it was given "
            f"{type(tokenizer).__name__}, not a processor); use a vision model or an env without images"
        )
    if count > codec.max_images:
        raise ImageError(f"{count} images exceed the model's limit of {codec.max_images} per context")
    return codec


def place_images(messages: list[dict[str, Any]], images: list[Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """The messages with every image in an image part, and the images in the order their parts appear.

    An image part (``{"type": "image"}``) carries its image inline (``"image": ...``) or takes the next of
    ``images``; when the messages hold no image part at all, ``images`` go at the start of the first user message
    (else of the first message).

    Raises:
        ImageError: image parts without an image are left over, or images without a part.
    """
    pending = list(images)
    if not any(p.get("type") == "image" for m in messages for p in _parts(m)):
        if not pending:
            return messages, []
        target = next((i for i, m in enumerate(messages) if m.get("role") == "user"), 0)
        messages = [dict(m) for m in messages]
        content = messages[target].get("content")
        text = [{"type": "text", "text": content}] if isinstance(content, str) and content else _parts(messages[target])
        messages[target]["content"] = [{"type": "image", "image": image} for image in pending] + text
        return messages, pending
    placed: list[Any] = []
    out = []
    for message in messages:
        if not any(p.get("type") == "image" for p in _parts(message)):
            out.append(message)
            continue
        content = []
        for part in message["content"]:
            if isinstance(part, dict) and part.get("type") == "image":
                if "image" not in part:
                    if not pending:
                        raise ImageError("the messages hold more image parts without an image than images came")
                    part = {**part, "image": pending.pop(0)}
                placed.append(part["image"])
            content.append(part)
        out.append({**message, "content": content})
    if pending:
        raise ImageError(f"{len(pending)} image(s) came without an image part to place them in the messages")
    return out, placed


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [p for p in content if isinstance(p, dict)] if isinstance(content, list) else []
