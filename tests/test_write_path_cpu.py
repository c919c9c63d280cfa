"""The write path's CPU savings keep the bytes: a run of chunks encoded at once (one
numpy pass for the residuals, a reused zstd context) stores exactly what encoding the
chunks one by one does, and the shard writer hands a commit's chunks over as one run."""

from __future__ import annotations

import numpy as np
import pytest

from zreplay.store import objectarray
from zreplay.store.imagecodec import ImageCodecError, RowDiff
from zreplay.store.shards import ArrayMeta, ChunkCodec
from zreplay.store.shardwriter import ShardWriter


def frames(n: int, shape: tuple, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, shape, dtype=np.uint8)
    drift = rng.integers(0, 3, (n, *shape), dtype=np.uint8)
    return np.cumsum(drift, axis=0, dtype=np.uint8) + base


@pytest.mark.parametrize("frame", [(5, 7), (5, 7, 1), (6, 9, 3), (4, 3, 4)])
@pytest.mark.parametrize("chunk_rows", [1, 3])
def test_a_run_encodes_to_the_bytes_of_its_chunks_one_by_one(frame, chunk_rows):
    codec = RowDiff({"level": 1}, (chunk_rows, *frame))
    rows = frames(4 * chunk_rows, frame)
    run = codec.encode_run(rows)
    one_by_one = [codec.encode(rows[i : i + chunk_rows]) for i in range(0, len(rows), chunk_rows)]
    assert run == one_by_one
    back = np.concatenate([codec.decode(b) for b in run])
    assert np.array_equal(back, rows)


def test_a_run_of_no_chunks_is_no_bytes_and_a_ragged_run_is_refused():
    codec = RowDiff({"level": 1}, (2, 4, 4, 3))
    assert codec.encode_run(np.zeros((0, 4, 4, 3), np.uint8)) == []
    with pytest.raises(ImageCodecError, match="run of"):
        codec.encode_run(np.zeros((3, 4, 4, 3), np.uint8))  # not whole chunks
    with pytest.raises(ImageCodecError, match="run of"):
        codec.encode_run(np.zeros((2, 4, 5, 3), np.uint8))


def test_chunk_codec_runs_carry_a_checksum_per_chunk_for_every_codec():
    import numcodecs

    rows = frames(6, (4, 4, 3))
    for comp in (RowDiff({"level": 1}, (2, 4, 4, 3)), numcodecs.Zstd(level=1), None):
        codec = ChunkCodec((2, 4, 4, 3), np.dtype(np.uint8), comp, crc=True)
        run = codec.encode_run(rows)
        assert run == [codec.encode(rows[i : i + 2]) for i in (0, 2, 4)]
        assert np.array_equal(np.concatenate([codec.decode(b) for b in run]), rows)


def _image_meta(chunk_rows: int, shard_rows: int) -> ArrayMeta:
    import json

    inner = [{"name": "zreplay.rowdiff", "configuration": {"level": 1}}, {"name": "crc32c"}]
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [64, 4, 4, 3],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [shard_rows, 4, 4, 3]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
        "fill_value": 0,
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [chunk_rows, 4, 4, 3],
                    "codecs": inner,
                    "index_codecs": [
                        {"name": "bytes", "configuration": {"endian": "little"}},
                        {"name": "crc32c"},
                    ],
                    "index_location": "end",
                },
            }
        ],
        "attributes": {"zreplay": {"all_chunks_stored": True}},
    }
    return ArrayMeta.parse(json.dumps(meta).encode(), "test")


def test_the_shard_writer_hands_each_write_its_whole_chunks_as_one_run():
    meta = _image_meta(chunk_rows=2, shard_rows=16)
    runs = []

    def encode_all(rows):
        runs.append(rows.shape)
        return meta.codec.encode_run(rows)

    w = ShardWriter(meta, "a", encode_all)
    rows = frames(13, (4, 4, 3))
    w.write(0, rows[:7], lambda s: None)  # 3 whole chunks and a partial one
    w.write(7, rows[7:13], lambda s: None)  # completes it: 3 more
    assert runs == [(6, 4, 4, 3), (6, 4, 4, 3)]
    assert np.array_equal(
        np.concatenate([meta.codec.decode(w.chunks[j]) for j in range(6)]), rows[:12]
    )


def test_runs_split_over_cores_on_chunk_boundaries_store_the_one_core_bytes(tmp_path, monkeypatch):
    # 3-frame rowdiff chunks, 7 chunks and a partial one a commit: one core encodes each
    # run whole, four cut it into runs of 2, 2, 2 and 1 chunks; the shard files agree.
    import zreplay

    rng = np.random.default_rng(5)
    trajs = [{"obs": rng.integers(0, 256, (11, 2, 6, 5, 3), dtype=np.uint8)} for _ in range(3)]
    layout = {"obs": {"codec": "rowdiff", "level": 1, "chunk_rows": 3, "shard_rows": 48}}
    trees = {}
    for cores in (1, 4):
        monkeypatch.setattr(objectarray.os, "cpu_count", lambda cores=cores: cores)
        path = tmp_path / f"cores{cores}"
        buf = zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=str(path), layout=layout
        )
        for t in trajs:
            buf.add_trajectories([t])
            buf.flush()
        buf.close()
        data = path / "segments" / "default" / "data" / "obs"
        trees[cores] = {f.name: f.read_bytes() for f in sorted(data.iterdir()) if f.is_file()}
        view = zreplay.open(path)
        for i, t in enumerate(trajs):
            np.testing.assert_array_equal(np.asarray(view.trajectory(i)["obs"]), t["obs"])
    assert trees[1] and trees[1] == trees[4]


def test_rowdiff_frames_are_the_same_chunks_with_or_without_the_zstandard_package(monkeypatch):
    from zreplay.store import imagecodec

    rows = frames(5, (6, 9, 3), seed=3)
    codec = RowDiff({"level": 3}, (1, 6, 9, 3))
    got = [codec.encode_run(rows)]
    if imagecodec.zstandard is not None:  # where installed: imagecodecs' encoder as well
        monkeypatch.setattr(imagecodec, "zstandard", None)
        got.append(codec.encode_run(rows))
    for run in got:
        assert np.array_equal(np.concatenate([codec.decode(b) for b in run]), rows)


def test_a_thread_reuses_its_zstd_context_and_threads_do_not_share_one():
    import threading

    from zreplay.store import imagecodec

    if imagecodec.zstandard is None:
        pytest.skip("the zstandard package is not installed (imagecodecs encodes)")
    mine = imagecodec.zstd_compressor(1)
    assert imagecodec.zstd_compressor(1) is mine
    assert imagecodec.zstd_compressor(2) is not mine
    other = []
    t = threading.Thread(target=lambda: other.append(imagecodec.zstd_compressor(1)))
    t.start()
    t.join()
    assert other[0] is not mine


def _zstd_frames(body: bytes, size: int):
    """Crafted rowdiff bodies: ``(name, zstd bytes, decodes?)``."""
    import zstandard

    plain = zstandard.ZstdCompressor(level=1)
    sizeless = zstandard.ZstdCompressor(level=1, write_content_size=False)
    return [
        ("as written", plain.compress(body), True),
        ("no declared size", sizeless.compress(body), True),
        ("bytes after the frame", plain.compress(body) + b"\0\0", False),
        ("two frames", plain.compress(body) + plain.compress(body), False),
        ("declares more", plain.compress(body + b"\0" * 64), False),
        ("declares less", plain.compress(body[: size // 2]), False),
        ("cut short", plain.compress(body)[:-3], False),
    ]


@pytest.mark.parametrize("package", ["zstandard", "imagecodecs"])
def test_rowdiff_chunks_decode_alike_through_either_zstd_and_refuse_the_same_frames(
    monkeypatch, package
):
    from zreplay.store import imagecodec

    if imagecodec.zstandard is None:
        pytest.skip("the zstandard package is not installed")
    rows = frames(1, (6, 9, 3), seed=4)
    codec = RowDiff({"level": 1}, (1, 6, 9, 3))
    good = codec.encode_run(rows)[0]
    header, body = good[:16], imagecodec.zstandard.ZstdDecompressor().decompress(good[16:])
    cases = _zstd_frames(body, len(body))
    if package == "imagecodecs":
        monkeypatch.setattr(imagecodec, "zstandard", None)
    for name, frame, decodes in cases:
        if decodes:
            assert np.array_equal(codec.decode(header + frame), rows), name
        else:
            with pytest.raises(ImageCodecError, match="rowdiff"):
                codec.decode(header + frame)
