"""Judge script (runs in the LeRobot venv): a LeRobot v3.0 dataset of ``image`` features
written by LeRobot 0.4.4's own writer, a grayscale and a colour camera, then the colour
camera's cells re-encoded as JPEG.

    make_image_kinds_dataset.py ROOT

``observation.images.gray`` (shape ``[H, W, 1]``): LeRobot's writer takes a grayscale
frame only as a PIL ``"L"`` image (a numpy ``[H, W, 1]`` array fails in its image
writer: "3 channels are required"), and stores it as a grayscale PNG.
``observation.images.rgb`` (``[H, W, 3]``): LeRobot's writer stores PNG only (its image
writer saves ``.png`` files that ``embed_images`` embeds); a dataset ported from JPEG
frames holds JPEG bytes in the same ``Image`` cells, which LeRobot's reader decodes with
Pillow as it does PNG.  So after ``finalize`` the data files are rewritten here with
each rgb cell as a JPEG of its frame (Pillow, quality 90), schema and metadata unchanged.
"""

import glob
import io
import sys

import numpy as np
import PIL.Image
import pyarrow as pa
import pyarrow.parquet as pq
import skimage.data
from lerobot.datasets.lerobot_dataset import LeRobotDataset

GRAY, RGB = (40, 56, 1), (48, 64, 3)


def main() -> None:
    root = sys.argv[1]
    frame = ["height", "width", "channels"]
    features = {
        "observation.images.gray": {"dtype": "image", "shape": GRAY, "names": frame},
        "observation.images.rgb": {"dtype": "image", "shape": RGB, "names": frame},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
    }
    ds = LeRobotDataset.create("zreplay/judge", fps=10, features=features, root=root)
    camera, coffee = skimage.data.camera(), skimage.data.coffee()
    rng = np.random.default_rng(0)
    for ep in range(3):
        for t in range(4 + ep):
            y, x = 7 * t + 30 * ep, 5 * t + 11 * ep
            gray = camera[y : y + GRAY[0], x : x + GRAY[1]]
            ds.add_frame(
                {
                    "observation.images.gray": PIL.Image.fromarray(gray, mode="L"),
                    "observation.images.rgb": coffee[y : y + RGB[0], x : x + RGB[1]],
                    "action": rng.uniform(-1, 1, 2).astype(np.float32),
                    "task": "look",
                }
            )
        ds.save_episode()
    ds.finalize()
    for path in glob.glob(f"{root}/data/*/*.parquet"):
        table = pq.read_table(path)
        i = table.schema.get_field_index("observation.images.rgb")
        cells = table.column(i).to_pylist()
        for c in cells:
            buf = io.BytesIO()
            PIL.Image.open(io.BytesIO(c["bytes"])).save(buf, format="JPEG", quality=90)
            c["bytes"] = buf.getvalue()
        column = pa.array(cells, table.schema.field(i).type)
        pq.write_table(table.set_column(i, table.schema.field(i), column), path)
    print(f"wrote {root}")


if __name__ == "__main__":
    main()
