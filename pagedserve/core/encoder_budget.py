"""The image encoder's share of a step. An image is encoded in the step that schedules its first
placeholder token (the workers cache the output for its later chunks), so a step's encoder work is the
images whose first token it schedules. Each step encodes at most --max-num-batched-tokens image tokens
(vLLM's default encoder budget): a chunk that would start an image past that is cut just before it, and
the image starts next step. An image larger than the whole budget is encoded in a step that starts no
other image, so it never waits for ever.

A family whose image tokens attend each other both ways (Gemma 3) needs all of an image's remaining tokens
in one chunk (`whole_images`): a chunk that would end inside an image ends before it, or, when it starts
inside one (a prefix hit ending there), waits until the rest of the image fits (--max-num-batched-tokens is
at least one image, config/scheduler.py)."""

from pagedserve.core.request import Request


def encoder_cut(
    request: Request, start: int, num_new: int, used: int, limit: int, whole_images: bool = False
) -> int:
    """How many of the `num_new` tokens from `start` the request may compute in a step whose images so far
    took `used` of `limit` encoder tokens."""
    for image in request.images:
        if whole_images and image.offset < start + num_new < image.offset + image.length:
            return max(image.offset - start, 0)
        if start <= image.offset < start + num_new:
            if used > 0 and used + image.length > limit:
                return image.offset - start
            used += image.length
    return num_new


def encoder_tokens(request: Request, start: int, num_new: int) -> int:
    """The image tokens the encoder computes for the tokens [start, start + num_new)."""
    return sum(image.length for image in request.images if start <= image.offset < start + num_new)
