"""Where the clips come from: procedural dynamics on CPU, or a diffusers image-to-video model on GPU.

    check_backend(cfg)                      # a missing package or model path fails here, before any work
    backend = make_backend(cfg)
    clips = backend.clips(plan)             # source frames, target frames, edit masks

A `Plan` is what a sample is made of (pipeline/data/video/sample.py draws it from a
synthesized table): the layout, the per-frame values (the data dynamics), the
camera and the edit. The procedural backend draws every frame of both clips
from the plan; the diffusers backend draws only the first frame of each (the
source chart and the edited chart) and lets the model animate both from the
same noise seed, so the two clips share their motion, which the filters then
check. Its edit mask is the edited region of the first frame, reused for
every generated frame: the model's motion may carry the region elsewhere,
and the preservation filter then rejects the sample (more rejections, never
a wrongly kept one).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.core.io import InputError
from pipeline.data.video.edits import Edit
from pipeline.data.video.render import Camera, Layout, Scene, changed_region, draw, region_mask, warp


@dataclass
class Plan:
    table: dict
    layout: Layout
    frame_values: list[np.ndarray]  # one (categories, series) array per frame
    camera: Camera
    edit: Edit
    seed: int


@dataclass
class Clips:
    source: list[np.ndarray]  # H x W x 3 uint8 frames
    target: list[np.ndarray]
    masks: list[np.ndarray]  # H x W bool, True inside the edited region


def edited_frame(plan: Plan, values: np.ndarray, margin: int) -> tuple[Image.Image, Image.Image, Image.Image]:
    """(source, target, mask) images of one frame, before the camera."""
    scene = Scene.of(plan.table, values)
    src, src_marks = draw(plan.layout, scene)
    tgt, tgt_marks = draw(plan.layout, plan.edit.apply(scene))
    mask = region_mask(changed_region(src_marks, tgt_marks), plan.layout.width, plan.layout.height, margin)
    return Image.fromarray(src), Image.fromarray(tgt), mask


class ProceduralBackend:
    """Redraw each frame at its values, then move the camera; deterministic, CPU only."""

    name = "procedural"

    def __init__(self, cfg) -> None:
        self.margin = cfg.mask_margin

    def clips(self, plan: Plan) -> Clips:
        n = len(plan.frame_values)
        out = Clips([], [], [])
        for k, values in enumerate(plan.frame_values):
            src, tgt, mask = edited_frame(plan, values, self.margin)
            cam = plan.camera.at(k / max(n - 1, 1))
            out.source.append(np.asarray(warp(src, cam)))
            out.target.append(np.asarray(warp(tgt, cam)))
            out.masks.append(np.asarray(warp(mask, cam, Image.Resampling.NEAREST, fill=0)) > 0)
        return out


class DiffusersBackend:
    """A diffusers image-to-video pipeline (Stable Video Diffusion, CogVideoX-I2V) from a local folder."""

    name = "diffusers"

    def __init__(self, cfg) -> None:
        import torch
        from diffusers import DiffusionPipeline

        self.cfg = cfg
        self.torch = torch
        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[cfg.dtype]
        self.pipe = DiffusionPipeline.from_pretrained(cfg.model_path, torch_dtype=dtype).to(cfg.device)
        self.pipe.set_progress_bar_config(disable=True)
        self.accepts = set(inspect.signature(self.pipe.__call__).parameters)

    def _animate(self, image: Image.Image, prompt: str, seed: int) -> list[np.ndarray]:
        cfg = self.cfg
        kwargs = {"image": image, "num_frames": cfg.frames, "height": cfg.height, "width": cfg.width,
                  "num_inference_steps": cfg.num_inference_steps,
                  "generator": self.torch.Generator(cfg.device).manual_seed(seed)}
        if "prompt" in self.accepts:  # CogVideoX-I2V is text-conditioned too; SVD is not
            kwargs["prompt"] = prompt
        if "fps" in self.accepts:  # SVD's micro-conditioning
            kwargs["fps"] = cfg.fps
        frames = self.pipe(**{k: v for k, v in kwargs.items() if k in self.accepts}).frames[0]
        if len(frames) != cfg.frames:
            raise InputError(f"animate.frames={cfg.frames}: {type(self.pipe).__name__} made {len(frames)} frames "
                             "(set animate.frames to a count the model generates; CogVideoX: 4k + 1)")
        size = (cfg.width, cfg.height)
        return [np.asarray(f.convert("RGB").resize(size, Image.Resampling.BILINEAR)) for f in frames]

    def clips(self, plan: Plan) -> Clips:
        src, tgt, mask = edited_frame(plan, plan.frame_values[0], self.cfg.mask_margin)
        prompt = f"A {plan.table['chart_type'].replace('_', ' ')} chart titled {plan.table['title']}, gently moving."
        # The same seed for both: the same noise gives the two clips the same motion.
        source = self._animate(src, prompt, plan.seed)
        target = self._animate(tgt, prompt, plan.seed)
        # The first frame's edited region stands for every frame: the model's motion is not known here.
        edit_mask = np.asarray(mask) > 0
        return Clips(source, target, [edit_mask] * len(source))


def check_backend(cfg) -> None:
    """Fail with a clear message before any work when the chosen backend cannot run."""
    if cfg.backend != "diffusers":
        return
    if importlib.util.find_spec("diffusers") is None:
        raise InputError("animate.backend=diffusers needs the diffusers package: "
                         "pip install -e '.[video]' (or set animate.backend: procedural)")
    index = Path(cfg.model_path or "") / "model_index.json"
    if not cfg.model_path or not index.is_file():
        raise InputError(f"animate.model_path={cfg.model_path!r}: not a local diffusers pipeline folder "
                         "(it needs model_index.json; download e.g. stable-video-diffusion-img2vid-xt there)")
    try:
        pipeline_class = str(json.loads(index.read_text()).get("_class_name", ""))
    except (OSError, ValueError, AttributeError) as exc:
        raise InputError(f"{index}: unreadable ({type(exc).__name__}: {exc})") from None
    # CogVideoX decodes 4 frames per latent frame after the first: it makes ((n - 1) // 4) * 4 + 1 of n asked.
    if pipeline_class.startswith("CogVideoX") and cfg.frames % 4 != 1:
        raise InputError(f"animate.frames={cfg.frames}: {pipeline_class} makes 4k + 1 frames "
                         f"(it would make {(cfg.frames - 1) // 4 * 4 + 1}); use e.g. 49")
    if cfg.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise InputError(f"animate.device={cfg.device}: no CUDA device visible (the diffusers backend needs a GPU)")


def make_backend(cfg) -> ProceduralBackend | DiffusersBackend:
    check_backend(cfg)
    return DiffusersBackend(cfg) if cfg.backend == "diffusers" else ProceduralBackend(cfg)
