"""The inference room's params: `generation`, the engine every local sampler runs on.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.params import Section


class GenerationConfig(Section):
    """`generation`: which engine samples a local model in mine, prm_data, evaluate and a local teacher's distill."""

    engine: Literal["hf", "vllm"] = Field(
        "hf", description="hf: the pipeline's KV-cache decode loop on transformers (any device); vllm: vLLM's "
        "engine (CUDA, `pip install -e .[gpu]`), sampling alike but faster on a GPU; step-level search and the PRM "
        "stay on transformers")
    vllm_gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="vllm: the GPU memory share vLLM takes; the rest holds the transformers "
        "copy that step search and the PRM use")
    vllm_max_model_len: int | None = Field(None, ge=16, description="vllm: longest prompt plus completion in tokens "
                                           "(null: the model's own limit)")
