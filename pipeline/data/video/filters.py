"""Consistency filters of a (source clip, target clip, edit masks) sample, in numpy.

    scores = score(source_frames, target_frames, masks)   # temporal_ssim, motion, preserved_psnr, preserved_ssim
    reasons = failures(scores, cfg)                        # [] when the sample is kept

- temporal consistency: the lowest SSIM between consecutive frames of either
  clip (a jump cut or a flicker drops it);
- motion: the mean absolute change of 2x2 block-averaged luma between
  consecutive frames (0-255 scale), averaged over the source clip (a
  near-static clip is not a video);
- preservation: PSNR (dB) and SSIM between source and target frames over the
  pixels outside the edit mask, averaged over frames (an edit that leaks into
  the rest of the chart drops it).

SSIM is the Wang et al. (2004) index on luminance with a 7x7 uniform window and
the sample covariance (scikit-image's `structural_similarity` defaults), over
the window positions that fit inside the frame. The filters compute SSIM and
motion on 2x2 block-averaged luma (`SCALE`), where an SSIM window spans 14x14
pixels and a change finer than a 2x2 block (a one-pixel checkerboard turning
over) averages out, and PSNR on the full-resolution RGB pixels. `temporal_ssim`
and `motion` compute what `score` reports; `ssim` is the full-resolution index.
"""

from __future__ import annotations

import numpy as np

WINDOW = 7
K1, K2, DATA_RANGE = 0.01, 0.03, 255.0
SCALE = 2  # the filters' SSIM and motion run on 2x2 block-averaged luma: a 4x cheaper clip score
PSNR_CAP = 100.0  # dB reported for identical pixels (PSNR is infinite there)


def grey(frame: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma as float32, the same weights as PIL's "L" mode."""
    frame = np.asarray(frame)
    if frame.ndim == 2:
        return frame.astype(np.float32)
    return frame[..., :3].astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)


def _box_mean(x: np.ndarray, k: int = WINDOW) -> np.ndarray:
    """Mean over every k x k window that fits (shape H-k+1, W-k+1), by running sums along each axis."""
    c = np.cumsum(x, axis=0, dtype=np.float64)
    rows = np.concatenate([c[k - 1 : k], c[k:] - c[:-k]], axis=0)
    c = np.cumsum(rows, axis=1)
    return (np.concatenate([c[:, k - 1 : k], c[:, k:] - c[:, :-k]], axis=1) / (k * k)).astype(np.float32)


def _pool(x: np.ndarray, f: int, op=np.mean) -> np.ndarray:
    """f x f blocks reduced by `op` (the frame cropped to a multiple of f)."""
    if f == 1:
        return x
    h, w = x.shape[0] // f * f, x.shape[1] // f * f
    return op(x[:h, :w].reshape(h // f, f, w // f, f), axis=(1, 3))


class _Stats:
    """A frame's luma (block-averaged by `scale`) with its local means and variances, computed once per frame."""

    __slots__ = ("g", "mu", "var")

    def __init__(self, frame: np.ndarray, scale: int = 1) -> None:
        self.g = _pool(grey(frame), scale)
        self.mu = _box_mean(self.g)
        n = WINDOW * WINDOW
        self.var = n / (n - 1) * (_box_mean(self.g * self.g) - self.mu * self.mu)  # sample variance


def _ssim_map(x: _Stats, y: _Stats) -> np.ndarray:
    n = WINDOW * WINDOW
    cov = n / (n - 1) * (_box_mean(x.g * y.g) - x.mu * y.mu)
    c1, c2 = (K1 * DATA_RANGE) ** 2, (K2 * DATA_RANGE) ** 2
    return ((2 * x.mu * y.mu + c1) * (2 * cov + c2)) / ((x.mu * x.mu + y.mu * y.mu + c1) * (x.var + y.var + c2))


def ssim_map(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Local SSIM of two frames (luminance), one value per 7x7 window position."""
    return _ssim_map(_Stats(a), _Stats(b))


def _masked_mean(m: np.ndarray, keep: np.ndarray | None, scale: int = 1) -> float:
    """Mean of an SSIM map over the windows that lie wholly on `keep` pixels (1.0 when there are none)."""
    if keep is None:
        return float(m.mean())
    keep = _pool(keep, scale, np.all)  # a block is kept only if all its pixels are
    inside = _box_mean(keep.astype(np.float32)) > 1 - 1e-6
    return float(m[inside].mean()) if inside.any() else 1.0


def ssim(a: np.ndarray, b: np.ndarray, keep: np.ndarray | None = None) -> float:
    """Mean SSIM, over the windows wholly inside `keep` (a bool H x W mask) when given."""
    return _masked_mean(ssim_map(a, b), keep)


def psnr(a: np.ndarray, b: np.ndarray, keep: np.ndarray | None = None) -> float:
    """PSNR in dB over all channels of the `keep` pixels; PSNR_CAP where they are identical."""
    diff = np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)
    if keep is not None:
        diff = diff[keep]
    mse = float(np.square(diff, dtype=np.int32).mean()) if diff.size else 0.0
    return PSNR_CAP if mse == 0 else min(PSNR_CAP, float(10 * np.log10(DATA_RANGE**2 / mse)))


def _temporal(stats: list[_Stats]) -> float:
    return min((float(_ssim_map(a, b).mean()) for a, b in zip(stats, stats[1:])), default=1.0)


def _motion(greys: list[np.ndarray]) -> float:
    return float(np.mean([np.abs(a - b).mean() for a, b in zip(greys, greys[1:])])) if len(greys) > 1 else 0.0


def temporal_ssim(frames: list[np.ndarray], scale: int = SCALE) -> float:
    """The lowest SSIM between consecutive frames (on `scale` x `scale` block-averaged luma, as `score`)."""
    return _temporal([_Stats(f, scale) for f in frames])


def motion(frames: list[np.ndarray], scale: int = SCALE) -> float:
    """Mean absolute luma change between consecutive frames (on `scale` x `scale` blocks, as `score`),
    averaged over the clip; 0-255."""
    return _motion([_pool(grey(f), scale) for f in frames])


def score(source: list[np.ndarray], target: list[np.ndarray], masks: list[np.ndarray]) -> dict[str, float]:
    """Every filter's measure for one sample; `masks` are True inside the edited region."""
    keeps = [~m for m in masks]
    src, tgt = [_Stats(f, SCALE) for f in source], [_Stats(f, SCALE) for f in target]
    preserved_ssim = [_masked_mean(_ssim_map(s, t), k, SCALE) for s, t, k in zip(src, tgt, keeps)]
    return {
        "temporal_ssim": round(min(_temporal(src), _temporal(tgt)), 4),
        "motion": round(_motion([s.g for s in src]), 3),
        "preserved_psnr": round(float(np.mean([psnr(s, t, k) for s, t, k in zip(source, target, keeps)])), 2),
        "preserved_ssim": round(float(np.mean(preserved_ssim)), 4),
        "edited_area": round(float(np.mean([m.mean() for m in masks])), 4),
    }


def failures(scores: dict[str, float], cfg) -> list[str]:
    """The filters a sample fails, by name (AnimateConfig holds the thresholds)."""
    out = []
    if scores["temporal_ssim"] < cfg.min_temporal_ssim:
        out.append("temporal")
    if scores["motion"] < cfg.min_motion:
        out.append("motion")
    if scores["preserved_psnr"] < cfg.min_preserved_psnr or scores["preserved_ssim"] < cfg.min_preserved_ssim:
        out.append("preservation")
    if scores["edited_area"] > cfg.max_edited_area:
        out.append("edited_area")
    return out
