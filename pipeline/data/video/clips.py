"""Clip files: H.264 MP4 through PyAV, a GIF preview and a PNG contact sheet.

    write_mp4(path, frames, fps=8)            # byte-identical for identical frames
    frames, fps = read_mp4(path)

x264 runs single-threaded with the container's bitexact flag, so the same
frames give the same bytes (no encoder timestamps or thread-order effects),
and without its AVX-512 code on CPUs that have it (see `_x264_params`).
"""

from __future__ import annotations

from fractions import Fraction
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from pipeline.data.video.render import font


@cache
def _x264_params() -> dict[str, str]:
    """x264 options that keep its output byte-identical on this CPU.

    On a CPU with AVX-512, x264 (PyAV 17 and 18 wheels) encoded identical frames
    to different bytes within one long-running process (the animate stage run
    twice in a test: 2 to 4 of 12 clips differed); capped at AVX2, which every
    AVX-512 CPU has, they came out identical in every rerun. Other CPUs keep
    x264's own choice: naming a CPU level there could ask for instructions it lacks.
    """
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    return {"x264-params": "asm=avx2"} if "avx512" in flags else {}


def write_mp4(path: Path, frames: list[np.ndarray], fps: int, crf: int = 18) -> None:
    import av

    height, width = frames[0].shape[:2]
    with av.open(str(path), mode="w", format="mp4", options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.options = {"crf": str(crf), "preset": "veryfast", "threads": "1", **_x264_params()}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def read_mp4(path: Path) -> tuple[list[np.ndarray], Fraction]:
    """(decoded RGB frames, the stream's frame rate)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        return frames, Fraction(stream.average_rate)


def write_gif(path: Path, source: list[np.ndarray], target: list[np.ndarray], fps: int) -> None:
    """Source and target side by side, looping."""
    pairs = [Image.fromarray(np.concatenate([s, t], axis=1)) for s, t in zip(source, target)]
    pairs[0].save(path, save_all=True, append_images=pairs[1:], duration=round(1000 / fps), loop=0)


def contact_sheet(path: Path, rows: list[tuple[str, list[np.ndarray], list[np.ndarray]]], columns: int = 4,
                  scale: float = 0.5) -> None:
    """One row per sample: `columns` frames of the source clip, then the same frames of the target."""
    h, w = rows[0][1][0].shape[:2]
    tw, th = int(w * scale), int(h * scale)
    caption = 14
    sheet = Image.new("RGB", (2 * columns * tw + 8, len(rows) * (th + caption)), (255, 255, 255))
    pen = ImageDraw.Draw(sheet)
    for r, (text, source, target) in enumerate(rows):
        y = r * (th + caption)
        pen.text((2, y + 1), text[:140], fill=(0, 0, 0), font=font(10))
        picks = np.linspace(0, len(source) - 1, columns).round().astype(int)
        for c, k in enumerate(picks):
            for half, clip in enumerate((source, target)):
                x = half * (columns * tw + 8) + c * tw
                sheet.paste(Image.fromarray(clip[k]).resize((tw, th), Image.Resampling.BILINEAR), (x, y + caption))
    sheet.save(path, format="png")
