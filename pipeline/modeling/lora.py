"""LoRA (PEFT) for the sft, grpo and dpo stages: wrap the loaded model, train it as usual, save it as params say.

    model = lora.wrap(model, cfg, "grpo")           # a PeftModel when lora.grpo is on, else `model` itself
    ...                                            # the TRL trainer trains the adapter alone
    lora.save(model, tokenizer, out, cfg, base=paths.model_dir("sft"))

`lora.save: merged` folds the adapter into full weights, so the folder is an ordinary model. `adapter` keeps only
the adapter (adapter_config.json, adapter_model.safetensors, the tokenizer) and names its base folder;
`pipeline.modeling.models.load_model` loads the base beneath it (recursively: an adapter may sit on an adapter's
folder). The base path is written relative to the repository root, as `pipeline.core.paths` names it, so a clone or
a DVC remote carries it; the stage that trained the adapter depends on that base, so DVC re-runs it when the base
changes.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.io import InputError
from pipeline.modeling.chat import save_tokenizer
from pipeline.modeling.models import save_model, writes_weights
from pipeline.modeling.params import LoraConfig


def is_adapter(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def wrap(model, cfg: LoraConfig, stage: str, seed: int = 0):
    """`model` with a fresh LoRA adapter (its own weights frozen) when `lora.<stage>` is on; else `model`. The
    adapter's initial weights are drawn from `seed` (the stage's), so a re-run starts from the same ones."""
    if not cfg.on(stage):
        return model
    import torch
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    config = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                            target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    torch.manual_seed(seed)
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # PEFT names what it did not find in the model
        raise InputError(f"lora.target_modules: {cfg.target_modules}: {exc}") from exc


def manifest(cfg: LoraConfig, stage: str) -> dict:
    """The manifest's record of the adapter settings when `stage` trains one (nothing otherwise)."""
    return {"lora": cfg.model_dump(mode="json")} if cfg.on(stage) else {}


def summary(model, cfg: LoraConfig) -> dict:
    """The stage metrics' record of a trained adapter: how it is saved and how many weights it trained."""
    if not is_adapter(model):
        return {}
    return {"lora": {"save": cfg.save, "r": cfg.r,
                     "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
                     "parameters": sum(p.numel() for p in model.parameters())}}


def save(model, tokenizer, folder: Path, cfg: LoraConfig, base: Path):
    """Save `model` into `folder` (merged or as an adapter on `base` when it is a PeftModel); the model to go on
    with (merged: the plain model the adapter was folded into)."""
    if not is_adapter(model):
        save_model(model, tokenizer, folder)
        return model
    if cfg.save == "merged":
        merged = model.merge_and_unload()
        save_model(merged, tokenizer, folder)
        return merged
    if not writes_weights(model):
        return model
    # the trained adapter alone: TRL's GRPO adds a frozen copy of it named "ref" (its KL reference), which PEFT
    # would save into a subfolder naming a base of its own
    model.save_pretrained(folder, safe_serialization=True, selected_adapters=[model.active_adapter])
    save_tokenizer(tokenizer, folder)
    (Path(folder) / "README.md").unlink(missing_ok=True)  # PEFT's model card, naming the base as it was in memory
    config_file = Path(folder) / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = str(base)  # relative to the repository root, where every stage runs
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return model
