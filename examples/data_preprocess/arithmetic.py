"""Write the built-in arithmetic task ("What is 3 + 4?" → "7") as train/test parquet files in veRL's schema.

    python examples/data_preprocess/arithmetic.py --local_save_dir ~/data/arithmetic

The rows are those of the demo that ``python -m verl.trainer.main_ppo`` trains on with no model or data given
(``verl.utils.demo``); ``data_source`` is ``verl/arithmetic``, which ``default_compute_score`` knows how to score.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from verl.utils.demo import TEST_SEED, TEST_SIZE, TRAIN_SEED, TRAIN_SIZE, make_arithmetic_rows

logger = logging.getLogger("arithmetic")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_save_dir", default="~/data/arithmetic", help="where train.parquet / test.parquet go")
    parser.add_argument("--train_size", type=int, default=TRAIN_SIZE)
    parser.add_argument("--test_size", type=int, default=TEST_SIZE)
    parser.add_argument("--train_seed", type=int, default=TRAIN_SEED)
    parser.add_argument("--test_seed", type=int, default=TEST_SEED)
    args = parser.parse_args(argv)
    if args.train_size <= 0 or args.test_size <= 0:
        parser.error("--train_size and --test_size must be positive")

    import pyarrow as pa
    import pyarrow.parquet as pq

    out = os.path.expanduser(args.local_save_dir)
    os.makedirs(out, exist_ok=True)
    splits = (("train", args.train_size, args.train_seed), ("test", args.test_size, args.test_seed))
    for split, size, seed in splits:
        path = os.path.join(out, f"{split}.parquet")
        pq.write_table(pa.Table.from_pylist(make_arithmetic_rows(size, seed, split)), path)
        logger.info("wrote %d rows to %s", size, path)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
