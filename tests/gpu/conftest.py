"""What the GPU tests share: a tiny student with wide random weights, saved as a stage saves a model."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.modeling.models import build_student, save_model, train_tokenizer
from pipeline.modeling.params import BaseModelConfig


def save_wide_student(folder: Path, texts: list[str], hidden_size: int, intermediate_size: int) -> Path:
    """A 2-layer, 2-head student whose random weights are wide (std 0.5), so that prompts lead to distinct
    continuations and a test comparing two engines' text can fail."""
    tok = train_tokenizer(texts, 300)
    cfg = BaseModelConfig(seed=0, vocab_size=300, hidden_size=hidden_size, intermediate_size=intermediate_size,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          max_position_embeddings=256)
    model = build_student(cfg, tok)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.5)
    save_model(model, tok, folder)
    return folder
