"""sft.mix: temporal questions of data/animate added to SFT's phase-1 rows (stages/sft.py calls mix_rows)."""

from __future__ import annotations

from pipeline import paths
from pipeline.config import SFTConfig
from pipeline.io import write_rows


def _questions(tmp_path, n: int) -> None:
    paths.animate_questions().parent.mkdir(parents=True)
    write_rows(paths.animate_questions(), [{"prompt": f"Video q{k}", "rationale": f"Answer: {k}"} for k in range(n)])


def test_mix_zero_keeps_sft_as_it_was(tmp_path, monkeypatch):
    from pipeline.video.questions import mix_rows

    monkeypatch.chdir(tmp_path)  # no data/animate here: mix 0 must not read it
    rows = [{"prompt": f"p{k}", "rationale": "Answer: 1"} for k in range(10)]
    cfg = SFTConfig(max_train_samples=6)
    assert mix_rows(cfg, rows) == (cfg, rows, 0)


def test_mix_adds_a_seeded_share_on_top_of_the_truncated_rows(tmp_path, monkeypatch):
    from pipeline.video.questions import mix_rows

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
