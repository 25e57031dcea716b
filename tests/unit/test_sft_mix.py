"""sft.mix: temporal questions of data/animate added to SFT's phase-1 rows (stages/sft.mix_rows)."""

from __future__ import annotations

from pipeline.core import paths
from pipeline.core.io import write_rows
from pipeline.data.params import SynthesizeConfig
from pipeline.training.params import SFTConfig


def _questions(tmp_path, n: int) -> None:
    paths.animate_questions().parent.mkdir(parents=True)
    write_rows(paths.animate_questions(), [{"prompt": f"Video q{k}", "rationale": f"Answer: {k}"} for k in range(n)])


def test_mix_zero_keeps_sft_as_it_was(tmp_path, monkeypatch):
    from stages.sft import mix_rows

    monkeypatch.chdir(tmp_path)  # no data/animate here: mix 0 must not read it
    rows = [{"prompt": f"p{k}", "rationale": "Answer: 1"} for k in range(10)]
    cfg = SFTConfig(max_train_samples=6)
    assert mix_rows(cfg, rows) == (cfg, rows, 0)


def test_mix_adds_a_seeded_share_on_top_of_the_truncated_rows(tmp_path, monkeypatch):
    from stages.sft import mix_rows

    monkeypatch.chdir(tmp_path)
    _questions(tmp_path, 4)
    rows = [{"prompt": f"p{k}", "rationale": "Answer: 1"} for k in range(10)]
    cfg, mixed, added = mix_rows(SFTConfig(mix=0.5, max_train_samples=6), rows)
    assert added == 3 and len(mixed) == 9 and cfg.max_train_samples == 9  # round(0.5 * 6) on top of 6
    assert [r["prompt"] for r in mixed[:6]] == [f"p{k}" for k in range(6)]
    assert all(r["prompt"].startswith("Video") for r in mixed[6:])
    assert mix_rows(SFTConfig(mix=0.5, max_train_samples=6), rows)[1] == mixed  # seeded
    cfg, mixed, added = mix_rows(SFTConfig(mix=2.0), rows)
    assert added == 4 and len(mixed) == 14 and cfg.max_train_samples is None  # at most all of them


def test_mix_reaches_phase_1_only(tmp_path, monkeypatch):
    """The raised max_train_samples and the temporal rows go to phase 1; curriculum stage 2 and logit
    distillation get the stage's own config and rows, and the ranking drill comes last. At mix 0 every phase gets
    what it got before sft.mix."""
    from types import SimpleNamespace

    import pipeline.inference.teacher
    from pipeline.data.params import DistillConfig
    from stages import sft

    monkeypatch.chdir(tmp_path)
    _questions(tmp_path, 4)
    calls = []

    def fake_sft_train(cfg, model, tokenizer, rows, val_rows, work_dir, live_dir, **overrides):
        calls.append(("sft", cfg.max_train_samples, [r["prompt"] for r in rows]))
        return {"examples": len(rows)}

    def fake_logit_distill(cfg, model, teacher, tokenizer, rows, work_dir, live_dir, *, seed, batch_size):
        calls.append(("logits", None, [r["prompt"] for r in rows]))
        return {}

    tok = SimpleNamespace(get_vocab=dict)
    monkeypatch.setattr(sft, "sft_train", fake_sft_train)
    monkeypatch.setattr(sft, "logit_distill", fake_logit_distill)
    monkeypatch.setattr(sft, "rank_drilled", lambda model, tokenizer, cfg, synth, live_dir, task_kind: calls.append(
        ("drill", cfg.steps, live_dir.name)))
    real_read = sft.read_rows  # the hard set is faked; the temporal questions are read from disk
    monkeypatch.setattr(sft, "read_rows", lambda path, required=(): (
        [{"prompt": "hard", "rationale": "Answer: 1"}] if path == sft.HARD else real_read(path, required=required)))
    monkeypatch.setattr(pipeline.inference.teacher, "load_local", lambda path: (None, tok))
    rows = [{"prompt": f"p{k}", "rationale": "Answer: 1"} for k in range(10)]
    distill = DistillConfig(method="logits")

    def phases(cfg: SFTConfig, mixed: bool) -> list:
        calls.clear()
        phase1 = sft.mix_rows(cfg, rows)[:2] if mixed else None
        sft.run(cfg, distill, SynthesizeConfig(), None, tok, rows, [], tmp_path / "work", tmp_path / "live", phase1)
        return list(calls)

    cfg = SFTConfig(mix=0.5, max_train_samples=6, curriculum=True)
    first, stage2, logits, drill = phases(cfg, mixed=True)
    assert first[:2] == ("sft", 9) and len(first[2]) == 9 and first[2][:6] == [f"p{k}" for k in range(6)]
    assert all(p.startswith("Video") for p in first[2][6:])
    assert stage2 == ("sft", 6, ["hard"])  # the stage's own max_train_samples, no temporal rows
    assert logits == ("logits", None, [f"p{k}" for k in range(10)])
    assert drill == ("drill", cfg.rank_drill.steps, "rank_drill")  # the ranking drill, last
    plain = cfg.model_copy(update={"mix": 0.0})
    assert phases(plain, mixed=True) == phases(plain, mixed=False)  # mix 0: as before sft.mix
    assert phases(plain, mixed=False)[0] == ("sft", 6, [f"p{k}" for k in range(10)])  # the trainer truncates


def test_max_train_samples_cuts_the_gold_rows_and_keeps_every_trace_on_top(tmp_path, monkeypatch):
    """sft.source mixed with a few gold rows (a real model's profile): the verified traces of data/distill come on
    top of the first max_train_samples gold rows, rather than being cut off behind the 6,000 gold ones."""
    from stages.sft import DISTILLED, training_rows

    monkeypatch.chdir(tmp_path)
    for file, name in ((paths.split_file("train"), "gold"), (DISTILLED, "trace")):
        file.parent.mkdir(parents=True, exist_ok=True)
        write_rows(file, [{"prompt": f"{name} {k}", "rationale": "Answer: 1"} for k in range(10)])
    rows, _ = training_rows("mixed", limit=3)
    assert [r["prompt"] for r in rows] == ["gold 0", "gold 1", "gold 2", *(f"trace {k}" for k in range(10))]
    assert [r["prompt"] for r in training_rows("distilled", limit=3)[0]] == ["trace 0", "trace 1", "trace 2"]
    assert len(training_rows("gold")[0]) == 10
