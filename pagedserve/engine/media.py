"""Image sources -> decoded Pillow images, every step bounded: data: URLs, http(s) URLs (allowed hosts, a
deadline for the whole download, a byte bound), file:// URLs (under the allowed folder only), and PIL images
handed in by the offline API. Pillow decodes; a file it cannot read (SVG, a truncated PNG, corrupt bytes),
an animated one, a decompression bomb or a degenerate size is refused with InvalidRequestError."""

import base64
import binascii
import io
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPMessage
from typing import IO, TYPE_CHECKING

from pagedserve.config.multimodal import MultiModalConfig
from pagedserve.errors import InvalidRequestError

if TYPE_CHECKING:
    from PIL.Image import Image

# The formats Pillow may decode (Image.open tries only these): still raster images.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
DATA_URL_MIME_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif", "image/bmp")
# NOTE: a side under 2 pixels leaves HF's image processors unable to tell the channel axis.
MIN_IMAGE_SIDE = 2
_CHUNK = 64 * 1024


class MediaLoader:
    """Loads and decodes the images of one model's requests under its MultiModalConfig bounds. `param`
    names the request field in each error."""

    def __init__(self, config: MultiModalConfig) -> None:
        self.config = config
        # NOTE: a redirect is checked against the allowed hosts too: an allowed host cannot lead elsewhere.
        self.opener = urllib.request.build_opener(_CheckedRedirects(self))

    def load(self, source: object, param: str) -> "Image":
        from PIL import Image

        if isinstance(source, Image.Image):
            return _checked(source, param)
        if not isinstance(source, str) or not source:
            raise InvalidRequestError(
                f"{param} must be an image URL (data:, http(s):// or file://) or a PIL image, "
                f"got {type(source).__name__}.",
                param=param,
            )
        scheme = source.split(":", 1)[0].lower() if ":" in source else ""
        if scheme == "data":
            data = self._data_url(source, param)
        elif scheme in ("http", "https"):
            data = self._download(source, param)
        elif scheme == "file":
            data = self._local_file(source, param)
        else:
            raise InvalidRequestError(
                f"{param}: unsupported image URL scheme {scheme!r}; use data:, http(s):// or file://.",
                param=param,
            )
        return decode_image(data, param)

    def _data_url(self, url: str, param: str) -> bytes:
        header, _, payload = url[5:].partition(",")
        mime, _, encoding = header.partition(";")
        if mime.lower() not in DATA_URL_MIME_TYPES:
            raise InvalidRequestError(
                f"{param}: unsupported image MIME type {mime[:64]!r}; use one of "
                f"{', '.join(DATA_URL_MIME_TYPES)}.",
                param=param,
            )
        if encoding != "base64":
            raise InvalidRequestError(
                f"{param}: a data: image URL must be base64 (data:{mime};base64,...).", param=param
            )
        # NOTE: checked before decoding: base64 is 4/3 of the bytes it holds.
        if len(payload) * 3 // 4 > self.config.max_media_bytes:
            raise self._too_large(param)
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidRequestError(
                f"{param}: the data: URL is not valid base64: {exc}", param=param
            ) from exc

    def check_host(self, url: str, param: str) -> None:
        host = (urllib.parse.urlsplit(url).hostname or "").lower()
        allowed = self.config.allowed_media_domains
        if allowed is not None and host not in allowed:
            raise InvalidRequestError(
                f"{param}: the image host {host!r} is not allowed; the server takes images from "
                f"{', '.join(allowed) or 'no host'} (--allowed-media-domains).",
                param=param,
            )

    def _download(self, url: str, param: str) -> bytes:
        self.check_host(url, param)
        timeout = self.config.fetch_timeout_s
        deadline = time.monotonic() + timeout
        chunks, size = [], 0
        try:
            with self.opener.open(url, timeout=timeout) as response:
                # NOTE: the deadline covers the whole body: a server dripping bytes never holds us longer.
                while chunk := response.read1(_CHUNK):
                    size += len(chunk)
                    if size > self.config.max_media_bytes:
                        raise self._too_large(param)
                    if time.monotonic() > deadline:
                        raise TimeoutError
                    chunks.append(chunk)
        except InvalidRequestError:
            raise  # a bound or a redirect refused above: its own message
        except TimeoutError as exc:
            raise InvalidRequestError(
                f"{param}: downloading the image took longer than {timeout:g} s (--media-fetch-timeout).",
                param=param,
            ) from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise InvalidRequestError(f"{param}: cannot download the image: {exc}", param=param) from exc
        return b"".join(chunks)

    def _local_file(self, url: str, param: str) -> bytes:
        root = self.config.allowed_local_media_path
        if root is None:
            raise InvalidRequestError(
                f"{param}: file:// image URLs are refused; start the server with "
                "--allowed-local-media-path to allow a folder.",
                param=param,
            )
        path = os.path.realpath(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
        if os.path.commonpath([path, root]) != root:
            raise InvalidRequestError(
                f"{param}: the file is outside the allowed folder {root} (--allowed-local-media-path).",
                param=param,
            )
        try:
            with open(path, "rb") as file:
                data = file.read(self.config.max_media_bytes + 1)
        except OSError as exc:
            raise InvalidRequestError(
                f"{param}: cannot read the image file: {exc.strerror}", param=param
            ) from exc
        if len(data) > self.config.max_media_bytes:
            raise self._too_large(param)
        return data

    def _too_large(self, param: str) -> InvalidRequestError:
        return InvalidRequestError(
            f"{param}: the image is larger than {self.config.max_media_bytes} bytes (--max-media-bytes).",
            param=param,
        )


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to an allowed host (raises the loader's InvalidRequestError otherwise)."""

    def __init__(self, loader: MediaLoader) -> None:
        self.loader = loader

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            raise InvalidRequestError("the image URL redirects to a non-http(s) URL.", param="image_url")
        self.loader.check_host(newurl, "image_url (redirected)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def decode_image(data: bytes, param: str) -> "Image":
    """Bytes -> an RGB image, decoded by Pillow from one of IMAGE_FORMATS."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
        _check_size(image, param)  # NOTE: before load(): the header alone says how large it would be
        image.load()
    except UnidentifiedImageError as exc:
        raise InvalidRequestError(
            f"{param}: the bytes are not an image in a supported format ({', '.join(IMAGE_FORMATS)}).",
            param=param,
        ) from exc
    except Image.DecompressionBombError as exc:
        raise _bomb(param) from exc
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt data
        raise InvalidRequestError(f"{param}: the image cannot be decoded: {exc}", param=param) from exc
    return _checked(image, param)


def _checked(image: "Image", param: str) -> "Image":
    _check_size(image, param)
    if getattr(image, "n_frames", 1) > 1:
        raise InvalidRequestError(
            f"{param}: animated images are not supported; send one still frame.", param=param
        )
    return image.convert("RGB")


def _check_size(image: "Image", param: str) -> None:
    from PIL import Image

    width, height = image.size
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:
        raise _bomb(param)
    if min(width, height) < MIN_IMAGE_SIDE:
        raise InvalidRequestError(
            f"{param}: the image is {width} x {height} pixels; each side must be at least {MIN_IMAGE_SIDE}.",
            param=param,
        )


def _bomb(param: str) -> InvalidRequestError:
    from PIL import Image

    return InvalidRequestError(
        f"{param}: the image has more than {Image.MAX_IMAGE_PIXELS} pixels (Pillow's decompression-bomb "
        "limit); send a smaller image.",
        param=param,
    )
