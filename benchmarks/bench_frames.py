"""Camera-frame codecs on real frames: bytes, encode and decode time, PSNR (issue 36, item 1).

    python benchmarks/bench_frames.py [--quick] [--out FILE]     # pip install -e ".[bench]"

Frame sets (uint8, HWC):

* ``atari``: gameplay frames of a few ALE games (ale-py, random policy, 210x160x3), and
  the same frames as DQN stores them (``atari-gray84``: 84x84 luma, one channel);
* ``photo-<h>x<w>``: a camera panning and zooming over the photos scikit-image ships
  (astronaut, coffee, chelsea, rocket, the motorcycle stereo pair) at 84x84, 224x224 and
  480x640, clean and with Gaussian sensor noise (``-noisy``: sigma 2 DN, rounded);
* ``sim-<n>``: renders of a small push-T-like scene (a T block, a round pusher, the target
  outline on a table), rasterized here with numpy at 4x supersampling, since gym-pusht
  pulls opencv-python and pygame into the environment.

Every candidate codes one frame at a time (zreplay's image chunks are one frame): zstd
and lz4 over raw pixels as zreplay stores them today, with and without predictive
filters (delta against the row above, channel planes, delta against the previous frame
in time), PNG (libpng, libspng), WebP lossless, JPEG-XL lossless at efforts 1-3 (and
fastest decoding), QOI; lossy JPEG (4:2:0, 4:4:4, and 4:4:4 with flat quantization
tables, which minimise squared error where the standard ones follow the eye), WebP,
JPEG-XL, AVIF (4:4:4 and 4:2:0) and JPEG 2000 at several qualities. For each
candidate and set: bytes per frame (and its ratio to PNG's and to raw), encode and decode
ms per frame on one thread and on two (a ThreadPoolExecutor of 2; imagecodecs and
numcodecs release the GIL; each codec's own threads set to 1), PSNR of the lossy ones.

The reference points: a buffer stored with today's layout (``zreplay.ReplayBuffer``) on
disk, its bytes per frame, and ``zreplay.open(path).sample(256)`` (page cache warm) against
decoding 256 frames drawn the same way from PNG.

For the lossy option (issue 36 item 3: at most 0.1x raw at >= 40 dB, decoding in at most
1 ms per 224x224 frame on one thread, in proportion for other sizes) the run reports per
photo set and family the smallest setting at >= 40 dB and which targets it meets
(``lossy_frontier``; ``--lossy-only`` measures just those candidates).

Sizes and PSNR are exact; times are medians of ``--repeats`` passes over each set.
Prints a table and writes JSON (``--out``; default benchmarks/results/latest/frames.json).
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib  # noqa: E402

ATARI_GAMES = ("Pong", "Breakout", "MsPacman", "Seaquest")
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "motorcycle_left", "motorcycle_right")
PHOTO_SIZES = ((84, 84), (224, 224), (480, 640))
NOISE_SIGMA = 2.0  # DN at 8 bits: a decent camera in good light
SAMPLE_N = 256
TARGET_PSNR_DB = 40.0
# issue 36's lossy option: at most this many bytes per raw byte at TARGET_PSNR_DB, decoded
# in at most DECODE_MS_224 per 224x224 frame on one thread (in proportion to pixels)
TARGET_OVER_RAW = 0.1
DECODE_MS_224 = 1.0
# zreplay's own lossless codec (layout codec "rowdiff") as a candidate
ROWDIFF = "zreplay.rowdiff (R-G,G,B-G + row-delta + zstd-1)"


# -- frame sets ----------------------------------------------------------------------------


def atari_frames(games, per_game: int, seed: int) -> np.ndarray:
    """u8[len(games) * per_game, 210, 160, 3]: observations of a uniform random policy
    (ALE v5: frameskip 4, sticky actions), every step after the first 50 of an episode."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    out = []
    for g, game in enumerate(games):
        env = gym.make(f"ALE/{game}-v5")
        env.action_space.seed(seed + g)
        obs, _ = env.reset(seed=seed + g)
        got, t = [], 0
        while len(got) < per_game:
            obs, _r, term, trunc, _ = env.step(env.action_space.sample())
            t += 1
            if term or trunc:
                obs, _ = env.reset()
                t = 0
            elif t > 50:
                got.append(obs)
        env.close()
        out.extend(got)
    return np.stack(out)


def dqn_gray84(frames: np.ndarray) -> np.ndarray:
    """u8[N, 84, 84, 1]: luma resized with area averaging, as DQN-style wrappers store it."""
    from skimage.transform import resize

    luma = frames.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    small = resize(luma, (len(frames), 84, 84), order=1, anti_aliasing=True, preserve_range=True)
    return np.rint(small).clip(0, 255).astype(np.uint8)[..., None]


def photos() -> list[np.ndarray]:
    import skimage.data as data

    left, right, _disp = data.stereo_motorcycle()
    loaded = {"motorcycle_left": left, "motorcycle_right": right}
    return [loaded[p] if p in loaded else getattr(data, p)() for p in PHOTOS]


def camera_frames(images, n: int, h: int, w: int, seed: int) -> np.ndarray:
    """u8[n, h, w, 3]: a camera panning and zooming over each photo in turn (n // len
    photos frames each): a window of the frame's aspect ratio covering 45-90% of the photo
    moves along a smooth path and is resampled to h x w (bilinear, anti-aliased)."""
    from skimage.transform import resize

    rng = np.random.default_rng(seed)
    out = np.empty((n, h, w, 3), np.uint8)
    per = -(-n // len(images))
    for i in range(n):
        img = images[i // per]
        t = (i % per) / max(1, per - 1)
        ih, iw = img.shape[:2]
        scale = 0.45 + 0.45 * (0.5 + 0.5 * np.cos(np.pi * t + rng.uniform(0, 0.1)))
        ch = min(ih, int(scale * min(ih, iw * h / w)))
        cw = min(iw, int(ch * w / h))
        y = int((ih - ch) * (0.5 + 0.45 * np.sin(2 * np.pi * t)))
        x = int((iw - cw) * t)
        crop = img[y : y + ch, x : x + cw].astype(np.float32)
        out[i] = np.rint(resize(crop, (h, w), order=1, anti_aliasing=True, preserve_range=True))
    return out


def with_noise(frames: np.ndarray, sigma: float, seed: int) -> np.ndarray:
    noise = np.random.default_rng(seed).normal(0, sigma, frames.shape)
    return np.rint(frames + noise).clip(0, 255).astype(np.uint8)


def sim_frames(n: int, size: int, seed: int) -> np.ndarray:
    """u8[n, size, size, 3]: a push-T-like scene: a grey T block sliding and turning, a
    blue round pusher chasing it, the green target T outline, on a light table with a
    darker border; rasterized at 4x and box-averaged (anti-aliased edges)."""
    rng = np.random.default_rng(seed)
    ss = 4 * size
    yy, xx = (np.mgrid[0:ss, 0:ss].astype(np.float32) + 0.5) / ss  # unit square
    border = (np.minimum(np.minimum(xx, 1 - xx), np.minimum(yy, 1 - yy)) < 0.03)[..., None]

    def t_shape(cx, cy, th, half=0.14, bar=0.05):
        c, s = np.cos(th), np.sin(th)
        u = (xx - cx) * c + (yy - cy) * s
        v = -(xx - cx) * s + (yy - cy) * c
        top = (np.abs(u) <= half) & (np.abs(v + half - bar) <= bar)
        stem = (np.abs(u) <= bar) & (v >= -half + 2 * bar) & (v <= half)
        return top | stem

    target = t_shape(0.5, 0.55, np.pi / 4)
    inner = t_shape(0.5, 0.55, np.pi / 4, half=0.125, bar=0.038)
    outline = (target & ~inner)[..., None]
    table = np.array([235, 235, 228], np.float32)
    p0, v = rng.uniform(0.3, 0.7, 2), rng.uniform(-0.004, 0.004, 2)
    a0, w = rng.uniform(0, 2 * np.pi), rng.uniform(-0.03, 0.03)
    out = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        cx, cy = 0.2 + (p0 + v * i - 0.2) % 0.6
        block = t_shape(cx, cy, a0 + w * i)[..., None]
        ang = 0.3 * i
        px, py = cx + 0.2 * np.cos(ang), cy + 0.2 * np.sin(ang)
        pusher = (((xx - px) ** 2 + (yy - py) ** 2) < 0.03**2)[..., None]
        img = np.where(border, [90, 90, 96], table)
        img = np.where(outline, [60, 170, 80], img)
        img = np.where(block, [120, 130, 150], img)
        img = np.where(pusher, [50, 80, 220], img)
        out[i] = np.rint(img.reshape(size, 4, size, 4, 3).mean((1, 3)))
    return out


def frame_sets(quick: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Every frame set by name (u8[N, H, W, C])."""
    per_game, n_cam, n_sim = (4, 6, 8) if quick else (8, 24, 16)
    games = ATARI_GAMES[:2] if quick else ATARI_GAMES
    atari = atari_frames(games, per_game, seed)
    sets = {"atari": atari, "atari-gray84": dqn_gray84(atari)}
    imgs = photos()
    for h, w in PHOTO_SIZES[:2] if quick else PHOTO_SIZES:
        # as many pixels at 480x640 as at 224x224 keeps the run's time even across sizes
        n = n_cam if h < 480 else max(len(PHOTOS), n_cam // 6)
        clean = camera_frames(imgs, n, h, w, seed)
        sets[f"photo-{h}x{w}"] = clean
        sets[f"photo-{h}x{w}-noisy"] = with_noise(clean, NOISE_SIGMA, seed + h)
    for size in (96, 224):
        sets[f"sim-{size}"] = sim_frames(n_sim, size, seed)
    sets["sim-224-noisy"] = with_noise(sets["sim-224"], NOISE_SIGMA, seed + 1)
    return sets


# -- candidates ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One way of coding one frame: ``encode(frame, previous) -> bytes`` and
    ``decode(bytes, shape, previous) -> frame``; ``previous`` is the frame before in
    time (only temporal prediction uses it: such a frame cannot be read alone)."""

    name: str
    lossless: bool
    encode: Callable
    decode: Callable
    family: str = ""
    setting: float | None = None  # the quality grid's value of a lossy candidate
    random_access: bool = True


def _delta(f: np.ndarray, axis: int) -> np.ndarray:
    """The residual against the previous row along ``axis`` (uint8 wraps: lossless)."""
    d = f.copy()
    head, tail = [slice(None)] * f.ndim, [slice(None)] * f.ndim
    head[axis], tail[axis] = slice(1, None), slice(None, -1)
    d[tuple(head)] -= f[tuple(tail)]
    return d


def _undelta(d: np.ndarray, axis: int) -> np.ndarray:
    return np.cumsum(d, axis=axis, dtype=np.uint8)


def _raw(shape, buf) -> np.ndarray:
    return np.frombuffer(buf, np.uint8).reshape(shape)


def byte_codecs() -> list[Candidate]:
    """zstd and lz4 over raw pixels (numcodecs, as zreplay's layouts use them), with
    and without predictive filters."""
    from numcodecs import LZ4, Blosc, Zstd

    z1, z3, lz = Zstd(level=1), Zstd(level=3), LZ4()
    # zreplay's codec="lz4" for uint8 keys: Blosc-lz4 level 5, bit-shuffled
    blz = Blosc(cname="lz4", clevel=5, shuffle=Blosc.BITSHUFFLE)

    def over(codec):
        def enc(f, _p):
            return codec.encode(np.ascontiguousarray(f))

        def dec(b, s, _p):
            return _raw(s, codec.decode(b))

        return enc, dec

    def rows(codec):
        def enc(f, _p):
            return codec.encode(_delta(f, 0))

        def dec(b, s, _p):
            return _undelta(_raw(s, codec.decode(b)), 0)

        return enc, dec

    def planes(codec, delta: bool):
        # HWC -> CHW: each channel a plane of its own, optionally row-delta'd
        def enc(f, _p):
            p = np.ascontiguousarray(np.moveaxis(f, -1, 0))
            return codec.encode(_delta(p, 1) if delta else p)

        def dec(b, s, _p):
            p = _raw((s[-1], *s[:-1]), codec.decode(b))
            return np.moveaxis(_undelta(p, 1) if delta else p, 0, -1)

        return enc, dec

    def in_time(codec):
        def enc(f, p):
            return codec.encode(f - p)

        def dec(b, s, p):
            return _raw(s, codec.decode(b)) + p

        return enc, dec

    return [
        Candidate("raw", True, lambda f, _p: f.tobytes(), lambda b, s, _p: _raw(s, b)),
        Candidate("zstd-1 (zreplay today)", True, *over(z1)),
        Candidate("zstd-3", True, *over(z3)),
        Candidate("lz4", True, *over(lz)),
        Candidate("blosc-lz4 bitshuffle", True, *over(blz)),
        Candidate("row-delta + zstd-1", True, *rows(z1)),
        Candidate("planes + zstd-1", True, *planes(z1, False)),
        Candidate("planes + row-delta + zstd-1", True, *planes(z1, True)),
        Candidate("planes + row-delta + lz4", True, *planes(lz, True)),
        Candidate("time-delta + zstd-1", True, *in_time(z1), random_access=False),
        Candidate(ROWDIFF, True, *zreplay_rowdiff(1)),
    ]


def zreplay_rowdiff(level: int):
    """zreplay's own codec (store/imagecodec.py ``RowDiff``) on one-frame chunks, as a
    buffer stores them."""
    from zreplay.store.imagecodec import RowDiff

    codecs: dict = {}

    def codec(shape):
        if shape not in codecs:
            codecs[shape] = RowDiff({"level": level}, (1, *shape))
        return codecs[shape]

    def enc(f, _p):
        return codec(f.shape).encode(f[None])

    def dec(b, s, _p):
        return codec(tuple(s)).decode(b)[0]

    return enc, dec


def image_codecs() -> list[Candidate]:
    """imagecodecs' PNG, WebP, JPEG-XL, QOI (lossless) and JPEG, WebP, JPEG-XL, AVIF
    (lossy, a quality grid each); every codec on one thread of its own."""
    import imagecodecs as ic

    def c(name, lossless, enc, dec, **kw):
        # a single-channel frame goes to the image codecs as a 2-D greyscale image
        def encode(f, _p):
            return enc(f[..., 0] if f.shape[-1] == 1 else f)

        def decode(b, s, _p):
            return dec(b).reshape(s)

        return Candidate(name, lossless, encode, decode, **kw)

    jxl_dec = lambda b: ic.jpegxl_decode(b, numthreads=1)  # noqa: E731
    webp_dec = ic.webp_decode
    out = [
        c("PNG (libpng)", True, ic.png_encode, ic.png_decode),
        c("PNG (libspng)", True, ic.spng_encode, ic.spng_decode),
        c("QOI", True, ic.qoi_encode, ic.qoi_decode),
        c("JPEG-LS", True, ic.jpegls_encode, ic.jpegls_decode),
        c(
            "WebP lossless",
            True,
            lambda f: ic.webp_encode(f, lossless=True, numthreads=1),
            webp_dec,
        ),
        c(
            "WebP lossless method 0",
            True,
            lambda f: ic.webp_encode(f, level=0, lossless=True, method=0, numthreads=1),
            webp_dec,
        ),
    ]
    for effort in (1, 2, 3):
        out.append(
            c(
                f"JPEG-XL lossless e{effort}",
                True,
                lambda f, e=effort: ic.jpegxl_encode(f, effort=e, lossless=True, numthreads=1),
                jxl_dec,
            )
        )
    for effort in (1, 3):
        out.append(
            c(
                f"JPEG-XL lossless e{effort} fast decoding",
                True,
                lambda f, e=effort: ic.jpegxl_encode(
                    f, effort=e, lossless=True, decodingspeed=4, numthreads=1
                ),
                jxl_dec,
            )
        )
    # libjpeg-turbo subsamples chroma 4:2:0 by default, which caps PSNR on photos
    for q, sub in ((75, "420"), (90, "420"), (95, "420"), (90, "444"), (95, "444"), (98, "444")):
        out.append(
            c(
                f"JPEG q{q} {sub}",
                False,
                lambda f, q=q, sub=sub: ic.jpeg8_encode(f, level=q, subsampling=sub),
                ic.jpeg8_decode,
                family="JPEG",
                setting=q,
            )
        )
    # between the grid points, Huffman tables optimized (layout codec jpeg-444)
    for q in (92, 93, 94, 96):
        out.append(
            c(
                f"JPEG q{q} 444 optimized",
                False,
                lambda f, q=q: ic.jpeg8_encode(f, level=q, subsampling="444", optimize=True),
                ic.jpeg8_decode,
                family="JPEG",
                setting=q,
            )
        )
    out += tuned_jpeg(c)
    for q in (75, 90, 95, 100):  # lossy WebP is always 4:2:0
        out.append(
            c(
                f"WebP q{q}",
                False,
                lambda f, q=q: ic.webp_encode(f, level=q, lossless=False, numthreads=1),
                webp_dec,
                family="WebP",
                setting=q,
            )
        )
    for d in (2.0, 1.0, 0.5, 0.4, 0.3, 0.25):
        out.append(
            c(
                f"JPEG-XL d{d} e3",
                False,
                lambda f, d=d: ic.jpegxl_encode(f, effort=3, distance=d, numthreads=1),
                jxl_dec,
                family="JPEG-XL",
                setting=d,
            )
        )
    # near 40 dB: faster (6) and slower (10) encoder settings; decode is dav1d either way
    for q, speed in ((75, 8), (85, 8), (88, 8), (88, 6), (88, 10), (90, 8), (95, 8)):
        out.append(
            c(
                f"AVIF q{q} speed {speed}",
                False,
                lambda f, q=q, s=speed: ic.avif_encode(f, level=q, speed=s, numthreads=1),
                lambda b: ic.avif_decode(b, numthreads=1),
                family="AVIF",
                setting=q,
            )
        )
    # imagecodecs' AVIF keeps chroma whole (4:4:4) by default; 4:2:0 decodes a little faster
    for q in (90, 95):
        out.append(
            c(
                f"AVIF q{q} speed 8 420",
                False,
                lambda f, q=q: ic.avif_encode(f, level=q, speed=8, pixelformat="420", numthreads=1),
                lambda b: ic.avif_decode(b, numthreads=1),
                family="AVIF 4:2:0",
                setting=q,
            )
        )
    # HTJ2K (OpenJPH: imagecodecs' level is the quantization step) and JPEG XR (level:
    # quality 0-1): wavelet-like codecs that decode faster than OpenJPEG's JPEG 2000.
    # imagecodecs' HTJ2K decoder casts samples to uint8 without clipping, so the few that
    # ring past 0 or 255 wrap around (1,176 of 3.6 M pixels at step 0.004, measured): its
    # PSNR here is what a reader would get, not the codec's
    wavelets = (
        (
            "HTJ2K",
            "step",
            (0.004, 0.005),
            partial(ic.htj2k_encode, reversible=False),
            ic.htj2k_decode,
        ),
        ("JPEG XR", "quality", (0.6, 0.7, 0.8), ic.jpegxr_encode, ic.jpegxr_decode),
    )
    for family, knob, levels, encode, decode in wavelets:
        out += [
            c(
                f"{family} {knob} {q}",
                False,
                lambda f, q=q, encode=encode: encode(f, level=q),
                decode,
                family=family,
                setting=q,
            )
            for q in levels
        ]
    # OpenJPEG with a target PSNR per layer (imagecodecs' level)
    for db in (41, 42, 44):
        out.append(
            c(
                f"JPEG 2000 {db} dB target",
                False,
                lambda f, db=db: ic.jpeg2k_encode(f, level=db, numthreads=1),
                lambda b: ic.jpeg2k_decode(b, numthreads=1),
                family="JPEG 2000",
                setting=db,
            )
        )
    return out


def tuned_jpeg(c) -> list[Candidate]:
    """Baseline JPEG 4:4:4 with flat quantization tables (one step for every coefficient,
    luma and chroma): the tables that minimise squared error for a bit rate, where the
    standard tables weight by what the eye sees. Encoded by Pillow (libjpeg-turbo, which
    takes custom tables where imagecodecs does not), decoded by imagecodecs; none without
    Pillow."""
    try:
        from PIL import Image
    except ImportError:
        return []
    import imagecodecs as ic

    def encode(f, step):
        buf = io.BytesIO()
        tables = [[step] * 64, [step] * 64]
        Image.fromarray(f).save(buf, "JPEG", qtables=tables, subsampling=0, optimize=True)
        return buf.getvalue()

    return [
        c(
            f"JPEG 444 flat tables step {step}",
            False,
            lambda f, step=step: encode(f, step),
            ic.jpeg8_decode,
            family="JPEG flat tables",
            setting=step,
        )
        for step in (5, 6, 7, 8, 9)
    ]


def candidates() -> list[Candidate]:
    return byte_codecs() + image_codecs()


# -- measuring -----------------------------------------------------------------------------


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of ``b`` against ``a`` (uint8, peak 255) over all their pixels; inf if equal."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _timed_passes(fn, n: int, threads: int, repeats: int, budget_s: float) -> list[float]:
    """Seconds per item of ``repeats`` passes of ``_timed_pass``, fewer (at least one)
    once the passes took ``budget_s``: slow encoders would otherwise take the hour."""
    out, t0 = [], time.perf_counter()
    while len(out) < repeats and (not out or time.perf_counter() - t0 < budget_s):
        out.append(_timed_pass(fn, n, threads))
    return out


def _timed_pass(fn, n: int, threads: int) -> float:
    """Seconds per item of ``fn(i)`` for every ``i < n``, on ``threads`` threads."""
    t0 = time.perf_counter()
    if threads == 1:
        for i in range(n):
            fn(i)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fn, range(n)))
    return (time.perf_counter() - t0) / n


def measure(
    cand: Candidate,
    frames: np.ndarray,
    repeats: int,
    budget_s: float = 4.0,
    clean: np.ndarray | None = None,
) -> dict:
    """Bytes, encode/decode ms per frame on 1 and 2 threads (median and min of up to
    ``repeats`` passes within ``budget_s`` each) and quality (PSNR against ``frames``, and
    against ``clean``, the frames before sensor noise, when given) of ``cand`` over
    ``frames`` (u8[N, H, W, C]); ``{"error": ...}`` where the codec refuses the frames
    (WebP and QOI take 3 or 4 channels only)."""
    prev = np.concatenate([np.zeros_like(frames[:1]), frames[:-1]])
    try:
        coded = [cand.encode(frames[i], prev[i]) for i in range(len(frames))]
        back = np.stack(
            [np.asarray(cand.decode(b, frames.shape[1:], prev[i])) for i, b in enumerate(coded)]
        )
    except Exception as e:  # the codec library says which frames it takes
        return {"error": f"{type(e).__name__}: {e}"}
    if back.shape != frames.shape:
        return {"error": f"decoded shape {back.shape} != {frames.shape}"}
    quality = psnr(frames, back)
    if cand.lossless and quality != float("inf"):
        return {"error": f"not lossless: PSNR {quality:.1f} dB"}
    n = len(frames)
    times = {}
    for threads in (1, 2):
        enc = _timed_passes(
            lambda i: cand.encode(frames[i], prev[i]), n, threads, repeats, budget_s
        )
        dec = _timed_passes(
            lambda i: cand.decode(coded[i], frames.shape[1:], prev[i]),
            n,
            threads,
            repeats,
            budget_s,
        )
        for what, got in (("encode", enc), ("decode", dec)):
            times[f"{what}_ms_{threads}t"] = 1e3 * float(np.median(got))
            times[f"{what}_ms_{threads}t_min"] = 1e3 * float(np.min(got))
            times[f"{what}_passes_{threads}t"] = len(got)
    per_frame = [psnr(frames[i], back[i]) for i in range(n)]
    return {
        "bytes_per_frame": float(np.mean([len(b) for b in coded])),
        **times,
        "psnr_db": None if cand.lossless else quality,
        "psnr_min_frame_db": None if cand.lossless else float(min(per_frame)),
        "psnr_vs_clean_db": None if clean is None or cand.lossless else psnr(clean, back),
    }


# -- the reference points: zreplay today vs PNG --------------------------------------------


REFERENCE_CODECS = ("zstd", "rowdiff")


def zreplay_reference(
    frames: np.ndarray, repeats: int, seed: int, codecs: tuple = REFERENCE_CODECS
) -> dict:
    """A buffer of ``frames`` (one episode, one frame per chunk) per layout codec in
    ``codecs`` on disk: bytes per frame of its image array, and ``view.sample(256)``
    without the decoded-chunk cache and the column cache (page cache warm), against
    decoding 256 frames drawn the same way (uniform over ``frames``) from in-memory PNGs
    (libpng, one thread). The buffers and the PNG decode take turns, one call each per
    round, so a load that comes and goes falls on all of them alike. ``sample`` and the
    ``disk_*`` figures at the top are those of today's default layout."""
    import imagecodecs as ic

    import zreplay
    from zreplay.store import layout

    work = Path(tempfile.mkdtemp(prefix="zreplay-bench-frames-"))
    n = len(frames)
    pngs = [ic.png_encode(f[..., 0] if f.shape[-1] == 1 else f) for f in frames]
    png_bytes = float(np.mean([len(b) for b in pngs]))
    rng = np.random.default_rng(seed)

    def png_256():
        return np.stack([ic.png_decode(pngs[i]) for i in rng.integers(0, n, SAMPLE_N)])

    views, per_codec = {}, {}
    try:
        for codec in codecs:
            path = work / codec
            buf = zreplay.ReplayBuffer(
                max_steps=n, path=path, seed=seed, layout={"pixels": {"codec": codec}}
            )
            buf.write_episode({"pixels": frames, "action": np.zeros((n, 2), np.float32)})
            buf.close()
            image = benchlib.dir_bytes(path / "segments" / "default" / "data" / "pixels")
            per_codec[codec] = {
                "disk_bytes_per_frame": image / n,
                "disk_over_png": image / n / png_bytes,
            }
            benchlib.warm_page_cache(path)
            views[codec] = zreplay.open(path, seed=seed, chunk_cache_bytes=0, column_cache_bytes=0)
        calls = {c: (lambda v=v: v.sample(SAMPLE_N)) for c, v in views.items()}
        calls["png"] = png_256
        times: dict = {c: [] for c in calls}
        for r in range(repeats + 2):  # two rounds of warm-up
            for c, fn in calls.items():
                t0 = time.perf_counter()
                fn()
                if r >= 2:
                    times[c].append(time.perf_counter() - t0)
    finally:
        for v in views.values():
            v.close()
        shutil.rmtree(work, ignore_errors=True)
    png = benchlib.stats(times.pop("png"))
    for codec, t in times.items():
        per_codec[codec]["sample_256"] = benchlib.stats(t)
        per_codec[codec]["sample_over_png_decode"] = float(np.median(t)) / png["median_s"]
        per_codec[codec]["sample_over_png_decode_min"] = min(t) / png["min_s"]
    default = per_codec.get(layout.DEFAULT_IMAGE_CODEC or "zstd", per_codec[codecs[0]])
    return {
        "frames": n,
        "frame_shape": list(frames.shape[1:]),
        "default_codec": layout.DEFAULT_IMAGE_CODEC or "zstd",
        "disk_bytes_per_frame": default["disk_bytes_per_frame"],
        "png_bytes_per_frame": png_bytes,
        "disk_over_png": default["disk_over_png"],
        "sample": {"no_chunk_cache": default["sample_256"]},
        "png_decode_256": png,
        "sample_over_png_decode": default["sample_over_png_decode"],
        "codecs": per_codec,
    }


# -- report --------------------------------------------------------------------------------


def summarize(results: dict, sets: dict[str, np.ndarray]) -> dict:
    """Add to every measured candidate its bytes as a multiple of raw and of PNG's
    (libpng) and its one-thread decode time as a multiple of PNG's."""
    for name, per_cand in results.items():
        raw = sets[name][0].nbytes
        png = per_cand.get("PNG (libpng)", {})
        png_bytes, png_dec = png.get("bytes_per_frame"), png.get("decode_ms_1t")
        for r in per_cand.values():
            if "error" in r:
                continue
            r["over_raw"] = r["bytes_per_frame"] / raw
            r["over_png"] = benchlib.ratio(r["bytes_per_frame"], png_bytes)
            r["decode_over_png"] = benchlib.ratio(r["decode_ms_1t"], png_dec)
    return results


def smallest_meeting_psnr(results: dict, lossy: list[Candidate]) -> dict:
    """Per photo set and lossy family: the cheapest grid setting with PSNR >= 40 dB."""
    out = {}
    for name, per_cand in results.items():
        if not name.startswith("photo-"):
            continue
        for fam in dict.fromkeys(c.family for c in lossy):
            ok = [
                (per_cand[c.name]["bytes_per_frame"], c.name)
                for c in lossy
                if c.family == fam
                and "error" not in per_cand.get(c.name, {"error": 1})
                and per_cand[c.name]["psnr_db"] >= TARGET_PSNR_DB
            ]
            out.setdefault(name, {})[fam] = min(ok)[1] if ok else None
    return out


def decode_budget_ms(shape) -> float:
    """The lossy decode target for frames of ``shape`` (H, W, ...): DECODE_MS_224 per
    224x224 frame, in proportion to the pixels."""
    return DECODE_MS_224 * shape[0] * shape[1] / (224 * 224)


def _targets(r: dict, budget_ms: float) -> dict:
    # decode by its fastest pass: the machine is shared, and a median carries other
    # people's load
    return {
        "bytes": r["over_raw"] <= TARGET_OVER_RAW,
        "psnr": r["psnr_db"] >= TARGET_PSNR_DB,
        "decode": r["decode_ms_1t_min"] <= budget_ms,
    }


def _brief(name: str, r: dict, budget_ms: float) -> dict:
    met = _targets(r, budget_ms)
    return {
        "candidate": name,
        "over_raw": r["over_raw"],
        "psnr_db": r["psnr_db"],
        "decode_ms_1t": r["decode_ms_1t"],
        "decode_ms_1t_min": r["decode_ms_1t_min"],
        "targets": met,
        "all_three": all(met.values()),
    }


def lossy_frontier(results: dict, lossy: list[Candidate], shapes: dict) -> dict:
    """Per photo set: for each lossy family its smallest setting at >= 40 dB (bytes / raw,
    PSNR, decode ms, which of the three targets it meets), the fewest bytes at >= 40 dB
    among settings that decode within budget, and the fastest decode among settings at
    >= 40 dB and at most 0.1x raw (None where nothing qualifies). ``shapes``: each set's
    frame shape, for its decode budget."""
    out = {}
    for name, fams in smallest_meeting_psnr(results, lossy).items():
        per_cand = results[name]
        budget = decode_budget_ms(shapes[name])
        ok = {
            c.name: per_cand[c.name]
            for c in lossy
            if "error" not in per_cand.get(c.name, {"error": 1})
            and per_cand[c.name]["psnr_db"] >= TARGET_PSNR_DB
        }
        fast = [n for n, r in ok.items() if r["decode_ms_1t_min"] <= budget]
        small = [n for n, r in ok.items() if r["over_raw"] <= TARGET_OVER_RAW]
        pick_small = min(fast, key=lambda n: ok[n]["over_raw"], default=None)
        pick_fast = min(small, key=lambda n: ok[n]["decode_ms_1t_min"], default=None)
        out[name] = {
            "decode_budget_ms": budget,
            "families": {
                fam: None if c is None else _brief(c, per_cand[c], budget)
                for fam, c in fams.items()
            },
            "fewest_bytes_within_decode": pick_small and _brief(pick_small, ok[pick_small], budget),
            "fastest_decode_within_bytes": pick_fast and _brief(pick_fast, ok[pick_fast], budget),
            "met": any(all(_targets(r, budget).values()) for r in ok.values()),
        }
    return out


def frontier_text(frontier: dict) -> str:
    lines = []
    for name, f in frontier.items():
        lines.append(
            f"{name}: all three targets (<= {TARGET_OVER_RAW}x raw, >= {TARGET_PSNR_DB} dB, "
            f"decode <= {f['decode_budget_ms']:.2f} ms) met: {f['met']}"
        )
        rows = list(f["families"].items())
        rows += [("fewest bytes within decode", f["fewest_bytes_within_decode"])]
        rows += [("fastest decode within bytes", f["fastest_decode_within_bytes"])]
        for label, b in rows:
            if b is None:
                lines.append(f"  {label:<28} none")
                continue
            lines.append(
                f"  {label:<28} {b['candidate']:<34} {b['over_raw']:.3f}x {b['psnr_db']:.1f} dB "
                f"decode {b['decode_ms_1t_min']:.2f} ms (median {b['decode_ms_1t']:.2f})"
            )
    return "\n".join(lines)


def frontier_markdown(frontier: dict) -> str:
    """benchmarks/README.md's table of a run's lossy frontier: per photo set and family
    the smallest setting at >= 40 dB, and the two ends of the frontier."""
    sets = list(frontier)
    fams = list(dict.fromkeys(fam for f in frontier.values() for fam in f["families"]))

    def cell(b):
        if b is None:
            return "none"
        mark = " **all three**" if b["all_three"] else ""
        return (
            f"{b['candidate']}: {b['over_raw']:.3f}x, {b['decode_ms_1t_min']:.2f} ms, "
            f"{b['psnr_db']:.1f} dB{mark}"
        )

    rows = [(fam, [frontier[s]["families"].get(fam) for s in sets]) for fam in fams]
    rows += [
        (
            "fewest bytes, decode within target",
            [frontier[s]["fewest_bytes_within_decode"] for s in sets],
        ),
        (
            f"fastest decode, at most {TARGET_OVER_RAW}x raw",
            [frontier[s]["fastest_decode_within_bytes"] for s in sets],
        ),
    ]
    out = [
        "| smallest setting >= 40 dB: bytes / raw, decode ms (fastest pass, 1 thread), PSNR | "
        + " | ".join(sets)
        + " |",
        "|---|" + "---|" * len(sets),
    ]
    out += [f"| {label} | " + " | ".join(map(cell, got)) + " |" for label, got in rows]
    out.append(
        "| decode target | "
        + " | ".join(f"{frontier[s]['decode_budget_ms']:.2f} ms" for s in sets)
        + " |"
    )
    out.append("| all three met | " + " | ".join(str(frontier[s]["met"]) for s in sets) + " |")
    return "\n".join(out)


def table_text(results: dict) -> str:
    head = (
        f"{'set':<20} {'candidate':<34} {'B/frame':>9} {'/PNG':>6} {'/raw':>6} "
        f"{'enc1':>7} {'enc2':>7} {'dec1':>7} {'dec2':>7} {'PSNR':>6} {'clean':>6}"
    )
    lines = [head, "-" * len(head)]
    for name, per_cand in results.items():
        for cname, r in per_cand.items():
            if "error" in r:
                lines.append(f"{name:<20} {cname:<34} n/a: {r['error'][:60]}")
                continue
            p = "" if r["psnr_db"] is None else f"{r['psnr_db']:.1f}"
            if r["psnr_vs_clean_db"] is not None:
                p += f" {r['psnr_vs_clean_db']:>6.1f}"
            lines.append(
                f"{name:<20} {cname:<34} {r['bytes_per_frame']:>9.0f} "
                f"{r['over_png'] or 0:>6.2f} {r['over_raw']:>6.3f} "
                f"{r['encode_ms_1t']:>7.2f} {r['encode_ms_2t']:>7.2f} "
                f"{r['decode_ms_1t']:>7.3f} {r['decode_ms_2t']:>7.3f} {p:>6}"
            )
        lines.append("")
    return "\n".join(lines)


README_LOSSLESS_SETS = (
    "atari",
    "atari-gray84",
    "photo-84x84-noisy",
    "photo-224x224",
    "photo-224x224-noisy",
    "photo-480x640-noisy",
    "sim-224",
    "sim-224-noisy",
)
README_LOSSY_SETS = (
    "photo-84x84",
    "photo-224x224",
    "photo-224x224-noisy",
    "photo-480x640",
    "sim-224",
    "atari",
)
README_LOSSLESS = (
    "zstd-1 (zreplay today)",
    "zstd-3",
    "blosc-lz4 bitshuffle",
    "row-delta + zstd-1",
    "planes + row-delta + zstd-1",
    "time-delta + zstd-1",
    ROWDIFF,
    "PNG (libpng)",
    "PNG (libspng)",
    "QOI",
    "JPEG-LS",
    "WebP lossless",
    "WebP lossless method 0",
    "JPEG-XL lossless e1",
    "JPEG-XL lossless e2",
    "JPEG-XL lossless e3",
)


def markdown(data: dict) -> str:
    """benchmarks/README.md's tables from a run's JSON: lossless candidates as bytes / PNG's
    and decode ms (one thread), PNG's bytes, lossy ones as bytes / raw, decode ms, PSNR."""
    res = data["results"]

    def table(title, sets, names, cell):
        sets = [s for s in sets if s in res]
        out = [f"| {title} | " + " | ".join(sets) + " |", "|---|" + "---|" * len(sets)]
        for c in names:
            got = [res[s].get(c) for s in sets]
            out.append(
                f"| {c} | "
                + " | ".join("n/a" if r is None or "error" in r else cell(r) for r in got)
                + " |"
            )
        return "\n".join(out)

    def lossy(r):
        q = "exact" if r["psnr_db"] == float("inf") else f"{r['psnr_db']:.1f} dB"
        return f"{r['over_raw']:.3f}x raw, {r['decode_ms_1t']:.2f} ms, {q}"

    if data.get("config", {}).get("lossy_only"):
        return "\n\n".join(
            [
                frontier_markdown(data["lossy_frontier"]),
                table(
                    "lossy: bytes / raw, decode ms (1 thread), PSNR",
                    list(res),
                    [c for c, v in data["candidates"].items() if not v["lossless"]],
                    lossy,
                ),
            ]
        )
    shown = [s for s in README_LOSSLESS_SETS if s in res]
    png = [res[s]["PNG (libpng)"] for s in shown]
    return "\n\n".join(
        [
            table(
                "lossless: bytes / PNG's, decode ms per frame (1 thread)",
                shown,
                README_LOSSLESS,
                lambda r: f"{r['over_png']:.2f}x, {r['decode_ms_1t']:.2f} ms",
            ),
            "| PNG (libpng) bytes per frame | "
            + " | ".join("n/a" if "error" in r else f"{r['bytes_per_frame']:.0f} B" for r in png)
            + " |",
            table(
                "lossy: bytes / raw, decode ms (1 thread), PSNR",
                README_LOSSY_SETS,
                [c for c, v in data["candidates"].items() if not v["lossless"]],
                lossy,
            ),
        ]
    )


def headline_rows(results: dict, reference: dict, best: dict) -> list[dict]:
    """The figures docs/benchmarks.md shows (report.py reads ``rows``)."""
    rows = []
    for label, ref in reference.items():
        rows.append(
            {
                "figure": f"frames {label}: zreplay today's bytes per frame on disk",
                "zreplay": f"{ref['disk_bytes_per_frame']:.0f} B",
                "peer": f"PNG {ref['png_bytes_per_frame']:.0f} B",
                "ratio": ref["disk_over_png"],
            }
        )
        rows.append(
            {
                "figure": f"frames {label}: view.sample(256) from disk (no chunk or column cache)",
                "zreplay": benchlib.fmt_time(ref["sample"]["no_chunk_cache"]["median_s"]),
                "peer": f"256 PNG decodes {benchlib.fmt_time(ref['png_decode_256']['median_s'])}",
                "ratio": ref["sample_over_png_decode"],
            }
        )
        for codec, r in ref.get("codecs", {}).items():
            rows.append(
                {
                    "figure": f"frames {label}: layout codec {codec}: view.sample(256) "
                    f"from disk (no chunk or column cache), {r['disk_over_png']:.2f}x PNG bytes",
                    "zreplay": benchlib.fmt_time(r["sample_256"]["median_s"]),
                    "peer": f"256 PNG decodes "
                    f"{benchlib.fmt_time(ref['png_decode_256']['median_s'])}",
                    "ratio": r["sample_over_png_decode"],
                }
            )
    for s in ("photo-224x224-noisy", "photo-224x224", "atari"):
        for cname in ("JPEG-XL lossless e1", "WebP lossless", "QOI", ROWDIFF):
            r = results.get(s, {}).get(cname)
            if r and "error" not in r:
                rows.append(
                    {
                        "figure": f"frames {s}: {cname} bytes, decode vs PNG",
                        "zreplay": f"{r['bytes_per_frame']:.0f} B, {r['decode_ms_1t']:.2f} ms",
                        "peer": f"PNG bytes {r['over_png']:.2f}x, decode",
                        "ratio": r["decode_over_png"],
                    }
                )
    for s, fams in best.items():
        if s != "photo-224x224-noisy":
            continue
        for fam, cname in fams.items():
            r = results[s].get(cname) if cname else None
            rows.append(
                {
                    "figure": f"frames {s}: smallest {fam} setting >= 40 dB",
                    "zreplay": "none on the grid"
                    if r is None
                    else f"{cname}: {r['psnr_db']:.1f} dB, {r['decode_ms_1t']:.2f} ms",
                    "peer": "raw bytes",
                    "ratio": None if r is None else r["over_raw"],
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: few frames, 1 repeat")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per figure (median)")
    ap.add_argument(
        "--budget", type=float, default=3.0, help="seconds of passes per figure, at most"
    )
    ap.add_argument("--sets", nargs="*", help="only these frame sets (default: all)")
    ap.add_argument(
        "--lossy-only",
        action="store_true",
        help="only the lossy candidates (and libpng, the reference); implies --no-reference",
    )
    ap.add_argument("--reference-frames", type=int, default=384, help="frames in the buffer")
    ap.add_argument("--no-reference", action="store_true", help="skip the buffer vs PNG part")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "latest" / "frames.json")
    ap.add_argument(
        "--markdown", type=Path, metavar="JSON", help="print the README's tables of a run; no run"
    )
    a = ap.parse_args(argv)
    if a.markdown:
        print(markdown(json.loads(a.markdown.read_text())))
        return 0
    if a.quick:
        a.repeats, a.reference_frames = 1, min(a.reference_frames, 64)
    if a.lossy_only:
        a.no_reference = True
    machine = benchlib.describe_machine(
        "frames", ("imagecodecs", "ale-py", "scikit-image", "gymnasium")
    )
    idle = benchlib.wait_idle(10)
    t0 = time.perf_counter()
    every_set = frame_sets(a.quick)
    sets = {k: v for k, v in every_set.items() if not a.sets or k in a.sets}
    print(
        "sets: "
        + ", ".join(f"{k} {v.shape[0]}x{'x'.join(map(str, v.shape[1:]))}" for k, v in sets.items()),
        flush=True,
    )
    cands = candidates()
    if a.lossy_only:
        cands = [c for c in cands if not c.lossless or c.name == "PNG (libpng)"]
    results: dict[str, dict] = {}
    for name, frames in sets.items():
        clean = every_set.get(name.removesuffix("-noisy")) if name.endswith("-noisy") else None
        results[name] = {c.name: measure(c, frames, a.repeats, a.budget, clean) for c in cands}
        print(f"  {name}: {time.perf_counter() - t0:.0f}s", flush=True)
    summarize(results, sets)
    lossy = [c for c in cands if not c.lossless]
    best = smallest_meeting_psnr(results, lossy)
    frontier = lossy_frontier(results, lossy, {k: v.shape[1:] for k, v in sets.items()})

    reference = {}
    if not a.no_reference:
        rounds = 5 if a.quick else 20
        for h, w in ((224, 224), (84, 84), (480, 640)):
            # a quarter of the frames at 480x640: the same order of bytes on disk
            n = a.reference_frames if h < 480 else max(8, a.reference_frames // 4)
            cam = with_noise(camera_frames(photos(), n, h, w, 7), NOISE_SIGMA, 8)
            reference[f"photo-{h}x{w}-noisy"] = zreplay_reference(cam, rounds, 1)
        per_game = max(1, a.reference_frames // len(ATARI_GAMES))
        atari = atari_frames(ATARI_GAMES, per_game, 3)
        reference["atari"] = zreplay_reference(atari, rounds, 1)

    print(table_text(results))
    print("smallest grid setting with PSNR >= 40 dB:", best)
    print(frontier_text(frontier))
    for label, ref in reference.items():
        for codec, r in ref["codecs"].items():
            print(
                f"reference {label} {codec}: {r['disk_bytes_per_frame']:.0f} B/frame "
                f"({r['disk_over_png']:.2f}x PNG); sample(256) without chunk and column "
                f"caches {benchlib.fmt_time(r['sample_256']['median_s'])}; 256 PNG decodes "
                f"{benchlib.fmt_time(ref['png_decode_256']['median_s'])} "
                f"({r['sample_over_png_decode']:.2f}x, minima {r['sample_over_png_decode_min']:.2f}x)"
            )
    result = {
        "benchmark": "frames",
        "machine": machine,
        "idle_before": idle,
        "config": vars(a) | {"out": str(a.out), "noise_sigma": NOISE_SIGMA},
        "sets": {k: list(v.shape) for k, v in sets.items()},
        "candidates": {
            c.name: {"lossless": c.lossless, "random_access": c.random_access} for c in cands
        },
        "results": results,
        "smallest_meeting_40db": best,
        "lossy_frontier": frontier,
        "reference": reference,
        "rows": headline_rows(results, reference, best),
        "wall_s": time.perf_counter() - t0,
    }
    benchlib.write_json(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
