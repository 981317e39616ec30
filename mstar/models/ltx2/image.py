"""Image-to-video's conditioning image, prepared as LTX2ImageToVideoPipeline prepares it: the image
re-compressed as one H.264 frame at the CRF the model was trained against (33 for LTX-2; 0 skips
it), resized bilinearly to the output size, scaled to [-1, 1]."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch


def recompress(image: np.ndarray, crf: int) -> np.ndarray:
    """uint8 RGB [H, W, 3] through one H.264 frame at `crf` (even sides, as the encoder needs);
    ltx-pipelines' media_io.preprocess, which the pipeline ports."""
    if crf == 0:
        return image
    import av

    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"the conditioning image must be uint8 [H, W, 3], got {image.dtype} {image.shape}")
    height, width = image.shape[0] // 2 * 2, image.shape[1] // 2 * 2
    image = np.ascontiguousarray(image[:height, :width])
    buffer = io.BytesIO()
    container = av.open(buffer, "w", format="mp4")
    try:
        stream = container.add_stream("libx264", rate=1, options={"crf": str(crf), "preset": "veryfast"})
        stream.height, stream.width = height, width
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
        container.mux(stream.encode(frame))
        container.mux(stream.encode())
    finally:
        container.close()
    with av.open(io.BytesIO(buffer.getvalue())) as decoded:
        stream = next(s for s in decoded.streams if s.type == "video")
        return next(decoded.decode(stream)).to_ndarray(format="rgb24")


def condition_image(image: Any, height: int, width: int, crf: int) -> torch.Tensor:
    """uint8 RGB [H, W, 3] (or a PIL image) -> [1, 3, height, width] float32 in [-1, 1]."""
    from PIL import Image

    array = np.asarray(image.convert("RGB")) if isinstance(image, Image.Image) else np.asarray(image)
    pil = Image.fromarray(recompress(array, crf))
    resized = pil.resize((width, height), resample=Image.Resampling.BILINEAR, reducing_gap=None)
    pixels = np.array(resized).astype(np.float32) / 255.0  # [H, W, 3]
    tensor = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
    return 2.0 * tensor - 1.0
