"""create_rl_dataset / create_rl_sampler / create_dataloader: seeded order, custom classes, exact resume."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torch.utils.data import SequentialSampler

from verl.utils.dataset import (
    RLHFDataset,
    create_dataloader,
    create_rl_dataset,
    create_rl_sampler,
    dataloader_seed,
)
from verl.utils.demo import build_demo_tokenizer, make_arithmetic_rows

CUSTOM = """
from torch.utils.data import Dataset, Sampler

from verl.utils.dataset import RLHFDataset


class Reversed(Sampler):
    def __init__(self, data_source, data_config):
        self.n = len(data_source)

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n


class Tagged(RLHFDataset):
    def __getitem__(self, item):
        return {**super().__getitem__(item), "tag": "custom"}


class NotADataset:
    def __init__(self, **kwargs):
        pass


not_a_class = 3
"""


@pytest.fixture(scope="module")
def tokenizer():
    return build_demo_tokenizer()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("data")
    paths = {
        "train": str(root / "train.parquet"),
        "test": str(root / "test.parquet"),
        "custom": str(root / "custom.py"),
    }
    pq.write_table(pa.Table.from_pylist(make_arithmetic_rows(20, 0, "train")), paths["train"])
    pq.write_table(pa.Table.from_pylist(make_arithmetic_rows(6, 1, "test")), paths["test"])
    with open(paths["custom"], "w") as f:
        f.write(CUSTOM)
    return paths


@pytest.fixture(scope="module")
def dataset(files, tokenizer) -> RLHFDataset:
    return create_rl_dataset(files["train"], {"max_prompt_length": 20}, tokenizer)


def indices(loader, epochs: int = 1) -> list[list[int]]:
    return [batch["index"].tolist() for _ in range(epochs) for batch in loader]


class TestSampler:
    def test_seeded_shuffle(self, dataset):
        def order(cfg):
            return list(create_rl_sampler(cfg, dataset))

        assert order({"seed": 3}) == order({"seed": 3}) != order({"seed": 4})
        assert order({}) == order({"seed": None}) == order({"seed": 1})  # null seed → 1
        assert sorted(order({})) == list(range(20)) and order({}) != list(range(20))
        assert dataloader_seed({}) == 1 and dataloader_seed({"seed": 9}) == 9

    def test_no_shuffle_is_sequential(self, dataset):
        sampler = create_rl_sampler({"shuffle": False}, dataset)
        assert isinstance(sampler, SequentialSampler) and list(sampler) == list(range(20))

    def test_custom_sampler_class(self, dataset, files):
        cfg = {"sampler": {"class_path": files["custom"], "class_name": "Reversed"}, "dataloader_num_workers": 0}
        assert list(create_rl_sampler(cfg, dataset)) == list(range(19, -1, -1))
        module_cfg = {"sampler": {"class_path": "torch.utils.data", "class_name": "SequentialSampler"}}
        # a real class, but it takes no data_config: the user's error surfaces as is
        with pytest.raises(TypeError, match=r"__init__\(\) got an unexpected keyword argument 'data_config'"):
            create_rl_sampler(module_cfg, dataset)

    @pytest.mark.parametrize(
        ("sampler", "workers", "error", "match"),
        [
            ({"class_name": "Reversed"}, 2, ValueError, "dataloader_num_workers=0"),
            ({"class_name": "not_a_class"}, 0, TypeError, "data.sampler.class_name='not_a_class'.*not a class"),
            ({"class_name": "Missing"}, 0, AttributeError, "data.sampler.class_name='Missing'"),
        ],
    )
    def test_custom_sampler_errors(self, dataset, files, sampler, workers, error, match):
        cfg = {"sampler": {"class_path": files["custom"], **sampler}, "dataloader_num_workers": workers}
        with pytest.raises(error, match=match):
            create_rl_sampler(cfg, dataset)


class TestCreateDataset:
    def test_max_samples_come_from_the_split_keys(self, files, tokenizer):
        cfg = {"train_max_samples": 5, "val_max_samples": 2, "shuffle": False}
        assert len(create_rl_dataset(files["train"], cfg, tokenizer)) == 5
        assert len(create_rl_dataset(files["test"], cfg, tokenizer, is_train=False)) == 2
        assert len(create_rl_dataset(files["test"], cfg, tokenizer, is_train=False, max_samples=-1)) == 6

    def test_custom_dataset_class(self, files, tokenizer):
        cfg = {"custom_cls": {"path": files["custom"], "name": "Tagged"}}
        assert create_rl_dataset(files["test"], cfg, tokenizer)[0]["tag"] == "custom"

    def test_custom_dataset_errors(self, files, tokenizer):
        with pytest.raises(TypeError, match="must subclass torch.utils.data.Dataset"):
            create_rl_dataset(
                files["test"], {"custom_cls": {"path": files["custom"], "name": "NotADataset"}}, tokenizer
            )
        with pytest.raises(FileNotFoundError, match="data.custom_cls.path"):
            create_rl_dataset(files["test"], {"custom_cls": {"path": "/nonexistent/ds.py", "name": "X"}}, tokenizer)
        with pytest.raises(NotImplementedError, match="data.datagen"):
            create_rl_dataset(files["test"], {"datagen": {"path": files["custom"], "name": "X"}}, tokenizer)


class TestDataloader:
    def make(self, dataset, workers: int = 0):
        return create_dataloader(dataset, 4, create_rl_sampler({"seed": 7}, dataset), num_workers=workers)

    @pytest.mark.parametrize("workers", [0, 1])
    def test_resume_mid_epoch_is_exact_in_a_later_epoch(self, dataset, workers):
        reference = indices(self.make(dataset, workers), epochs=3)
        loader = self.make(dataset, workers)
        seen = indices(loader)  # epoch 1
        it = iter(loader)
        seen += [next(it)["index"].tolist() for _ in range(2)]  # 2 batches into epoch 2
        state = pickle.loads(pickle.dumps(loader.state_dict()))  # as a checkpoint would store it
        resumed = self.make(dataset, workers)
        resumed.load_state_dict(state)
        seen += indices(resumed, epochs=2)  # rest of epoch 2, then epoch 3
        assert len(reference) == 15 and seen == reference

    def test_resume_at_an_epoch_boundary(self, dataset):
        reference = indices(self.make(dataset), epochs=2)
        loader = self.make(dataset)
        seen = indices(loader)
        resumed = self.make(dataset)
        resumed.load_state_dict(loader.state_dict())
        seen += indices(resumed)
        assert seen == reference

    def test_batches_are_dataproto_ready(self, dataset):
        batch = next(iter(self.make(dataset)))
        assert batch["input_ids"].shape == (4, 20) and batch["raw_prompt"].shape == (4,)

    def test_drop_last_false_keeps_the_tail(self, files, tokenizer):
        val = create_rl_dataset(files["test"], {}, tokenizer, is_train=False)
        assert [len(b) for b in indices(create_dataloader(val, 4, None, drop_last=False))] == [4, 2]

    @pytest.mark.parametrize("size", [0, -1, 2.0, True])
    def test_bad_batch_size(self, dataset, size):
        with pytest.raises(ValueError, match="must be a positive int"):
            create_dataloader(dataset, size)

    def test_a_dataset_smaller_than_a_batch(self, dataset):
        with pytest.raises(ValueError, match="fewer than one batch of 64"):
            create_dataloader(dataset, 64)
