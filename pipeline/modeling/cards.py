"""What a model folder says about itself: its manifest (how it was made) and a model card (README.md) for people.

    cards.write_model_manifest(out, "sft", cfg, inputs=[...], metrics=metrics)   # after the weights are saved

Any tool pointed at `models/<name>` (transformers' `pipeline`, `transformers serve`, vLLM, lm-eval, the Hub) reads
the folder alone: the card says what the model is, how it was made, its params and metrics, the prompt format it
was trained on and how to load it. The manifest (`pipeline_config.json`) carries the same facts for the pipeline,
with the sha256 of every input. Neither holds a wall-clock figure: a re-run that makes the same weights writes the
same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from pipeline.core import paths
from pipeline.core.io import atomic_write_text, read_json, untimed, write_manifest
from pipeline.modeling import chat

CARD = "README.md"

# What each stage's model is, in a line (the card's first paragraph).
WHAT = {
    "base": "The student before post-training: loaded as it is, or built here (a tokenizer trained on the task's "
            "corpus, a small causal LM, table-reading drills).",
    "teacher": "The teacher whose verified traces are distilled into the student.",
    "sft": "The student after supervised fine-tuning (TRL's SFTTrainer) on gold rationales and the teacher's "
           "verified traces.",
    "grpo": "The SFT student after reinforcement learning on verifiable rewards (TRL's GRPOTrainer, or TBRM).",
    "sft_extended": "The compute-matched baseline: the SFT student trained on for GRPO's compute in token passes.",
    "dpo": "The SFT student after direct preference optimisation (TRL's DPOTrainer) on correct-versus-incorrect "
           "pairs.",
    "prm": "The process reward model: the policy's LM head read as a verdict on every line of a solution.",
}


def write_model_manifest(folder: Path, stage: str, params: Any, inputs: Sequence[Path | str] = (),
                         **extra: Any) -> None:
    """`pipeline_config.json` (with the prompt format the model was trained on) and the model card, in `folder`."""
    prompt = chat.active().model_dump(mode="json")
    write_manifest(folder, stage, params, inputs=inputs, name=paths.MODEL_MANIFEST, prompt=prompt, **extra)
    atomic_write_text(Path(folder) / CARD, card(Path(folder), read_json(Path(folder) / paths.MODEL_MANIFEST)))


def card(folder: Path, manifest: dict) -> str:
    """The model card of `folder` from its manifest and the config and tokenizer files beside it."""
    stage = manifest["stage"]
    name = paths.model_dir(stage)
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             f"tags: [reasoning-pipeline, {stage}]", "---", "", f"# {name}", "",
             WHAT.get(stage, f"The output of stage `{stage}`."), ""]
    reference = manifest.get("teacher_backend")
    if reference:
        lines += [f"No weights here: a reference to the {reference['backend']} model `{reference.get('model')}`"
                  + (f" at {reference['base_url']}" if reference.get("base_url") else "") + ".", ""]
    lines += ["| | |", "|---|---|"]
    if not reference:
        lines.append(f"| model | {_architecture(folder)} |")
    lines += [f"| prompt format | {_prompt_line(manifest.get('prompt') or {})} |",
              f"| made by | stage `{stage}` of dvc.yaml (`python -m stages.{stage}`), seed {manifest.get('seed')} |"]
    if manifest.get("inputs"):
        lines.append("| from | " + ", ".join(f"`{p}`" for p in manifest["inputs"]) + " |")
    if manifest.get("lora"):
        lines.append(f"| adapters | LoRA r {manifest['lora'].get('r')}, saved {manifest['lora'].get('save')} |")
    lines += ["", f"The whole record, with the sha256 of every input and the library versions: "
              f"`{paths.MODEL_MANIFEST}`.", ""]
    metrics = untimed(manifest.get("metrics") or {})
    if metrics:
        lines += [f"## Training metrics (`{paths.metrics_file(stage)}`)", "", "```yaml",
                  yaml.safe_dump(metrics, sort_keys=True, width=100).rstrip(), "```", ""]
    if stage != "prm":
        lines += ["## Test metrics", "", f"Measured after this folder was written, by the stage `evaluate@{stage}`: "
                  f"`{paths.eval_metrics_file(stage)}` (and `python -m pipeline report --results`).", ""]
    lines += [f"## Params (`params.yaml`, section `{stage}`)", "", "```yaml",
              yaml.safe_dump(manifest.get("params") or {}, sort_keys=True, width=100).rstrip(), "```", ""]
    if not reference:
        lines += ["## Load", "", "```python", *_load_lines(name, manifest.get("prompt") or {}), "```", ""]
    return "\n".join(lines)


def _architecture(folder: Path) -> str:
    config = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    adapter = folder / "adapter_config.json"
    if not config and adapter.is_file():
        base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        return f"a LoRA adapter on `{base}` (PEFT)"
    kind = ", ".join(config.get("architectures") or [config.get("model_type", "?")])
    return (f"{kind} (layers {config.get('num_hidden_layers')}, hidden size {config.get('hidden_size')}, "
            f"vocabulary {config.get('vocab_size')} tokens)")


def _prompt_line(prompt: dict) -> str:
    if prompt.get("format") == "chat":
        system = f"; system message: {prompt['system']!r}" if prompt.get("system") else ""
        return f"chat: each question a user message rendered by the tokenizer's chat template{system}"
    return "raw: the question's text as it is, the answer written after it (no chat template)"


def _load_lines(name: Path, prompt: dict) -> list[str]:
    lines = ["from transformers import AutoModelForCausalLM, AutoTokenizer", "",
             f'tokenizer = AutoTokenizer.from_pretrained("{name}")',
             f'model = AutoModelForCausalLM.from_pretrained("{name}")',
             '# a question as the task writes it: the `prompt` column of data/synthesize/test.parquet',
             'question = "Chart: bar. Title: Sales (k$).\\nMon: 12 grey | Tue: 7 teal\\nQuestion: What is the value '
             'of the bar for Mon?\\n"']
    if prompt.get("format") == "chat":
        messages = ([{"role": "system", "content": prompt["system"]}] if prompt.get("system") else [])
        lines += [f"messages = {messages!r} + [{{'role': 'user', 'content': question}}]",
                  "text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)"]
    else:
        lines.append("text = question  # raw: the model continues the question's text")
    lines += ['ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)',
              "out = model.generate(**ids, max_new_tokens=128, do_sample=False)",
              'print(tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))']
    return lines
